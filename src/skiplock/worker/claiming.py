"""A worker slot's claim: which claim it makes (the plain one, or the flow claim) and how many jobs it takes.

Guarantees:

- No claim while a suspect runs alone in the process, or waits to: the slot holds the gate (gate.py)
  from before its claim to its COMMIT.
- The plain claim takes up to ``size`` jobs of the unlimited tasks (``FOR UPDATE SKIP LOCKED``, in a
  new transaction of the slot's lease); more than one only with a batch turn of the worker's
  :class:`~skiplock.worker.batching.BatchPolicy` (``batch_slots``), given back when there is no batch
  to run. A job that must run alone (``executor.alone``) coming first makes it let the others go at
  once and take that one.
- Flow-controlled jobs (worker/flow.py) are claimed only by the flow claim, in batches as above (one
  at a time with a rate or from a weighted fair queue). When they may be waiting, each slot
  alternates which claim it tries first and tries the other if it finds none; after a flow claim
  found nothing, no slot of the process tries the flow claim first for ``FLOW_REST_SECONDS`` while
  plain claims find work -- doubling with each flow claim in a row that finds nothing, up to
  ``PLAIN_REST_SECONDS`` -- and after a plain claim found nothing, none tries the plain claim first
  for ``PLAIN_REST_SECONDS`` while flow claims find work. The rests are the process's, not each
  slot's: an empty claim of one kind walks the other kind's waiting jobs on the claim index, so the
  walks it costs per second do not grow with the slots (docs/flow-control.md, "Not done"); and a
  rest lasts at least the last empty walk of its kind over ``WALK_SHARE``, so those walks take at
  most about that share of the process's time however long they get.
- A full claim wakes two idle slots to look too (a burst reaches n slots in about log2(n) round trips).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, cast

from .batching import ClaimSize
from .executor import Executor
from .flow import FlowControl
from .queue_view import QueueView
from .side_by_side import plan

if TYPE_CHECKING:
    from ..backend.base import Lease, QueueViewBackend
    from .loop import Worker

log = logging.getLogger("skiplock.worker")

# After a flow claim found nothing, the process's slots whose plain claims find work try it first
# again only after this long (an empty plain claim tries it at once); twice as long after each
# further flow claim in a row that found nothing, up to PLAIN_REST_SECONDS. A fixed 50 ms cost a
# plain drain of a worker whose app has any flow-controlled task more than a third of its throughput
# (with 8 slots taking turns at batches, a slot claims every 20-30 ms, so every other claim was an
# empty flow claim holding the batch turn; measured, docs/flow-control.md "What it costs").
FLOW_REST_SECONDS = 0.05
# After a plain claim found nothing, the process's slots whose flow claims find work try it first
# again only after this long (an empty flow claim tries it at once). Longer than FLOW_REST_SECONDS:
# a slot draining a flow backlog in batches claims every few hundred ms, and a plain claim first
# every other time cost the flow drain half its throughput (measured, docs/flow-control.md). A plain
# job enqueued while every slot is busy with flow jobs waits up to about this long for its first
# claim. (Per slot, with 1 s, a process of n slots made about n empty claims a second, each walking
# the other kind's waiting jobs; per process, 4 a second whatever n.)
PLAIN_REST_SECONDS = 0.25
# An empty claim of one kind walks the other kind's waiting jobs on the claim index (a cost that
# grows with them: docs/flow-control.md, "Not done"), so a rest is also at least the time the last
# empty claim of its kind took divided by this share: such walks take at most about this share of
# the process's time, however long the backlog makes them (a 250 ms walk: a rest of 5 s).
WALK_SHARE = 0.05


class Claimer:
    """The claims of one :class:`~skiplock.worker.loop.Worker` (``w``), per slot ``index``: its queues,
    tasks, batching policy and flow claim are the worker's."""

    def __init__(self, worker: "Worker"):
        self.w = worker
        self._flow_first: dict[int, bool] = {}  # per slot: which claim goes first next (they alternate)
        # the process's (every slot's; a float or int assignment is atomic under the GIL):
        self._flow_rest = 0.0  # no flow claim first before this (one found none)
        self._plain_rest = 0.0  # no plain claim first before this (one found none)
        self._flow_empty = 0  # flow claims in a row that found nothing
        self._plain_empty = False  # the last plain claim found nothing
        self._flow_walk = 0.0  # seconds the last flow claim that found nothing took
        self._plain_walk = 0.0  # seconds the last plain claim that found nothing took
        self._took: dict[int, float] = {}  # per slot: seconds its last claim statement(s) took
        self.limits: dict[int, int] = {}  # per slot: how many jobs its last claim could take (BatchPolicy.share)
        self.side: dict[int, bool] = {}  # per slot: its last claim was sized to run side by side (side_by_side.py)
        # per slot: its last claim found every job available to the worker (a plain claim that came
        # back short, with no flow claim in play: Worker._drained)
        self.found_all: dict[int, bool] = {}

    def claim(self, lease: "Lease", size: ClaimSize, executor: Executor,
              index: int) -> tuple[list[Any], bool]:
        """Claim the next job(s) in a new transaction of ``lease``. Returns them, and whether this slot
        now holds a batch turn (only while it has a batch of fast jobs to run; see ``batch_slots``).
        When flow-controlled jobs may be waiting (worker/flow.py), each slot alternates which claim
        it tries first, the flow claim (one job) or the plain one, and tries the other if it finds none."""
        flow = self.w.flow
        self.found_all[index] = False
        self.side[index] = False
        if flow is None or not flow.active():
            return self._plain_claim(lease, size, executor, index, only=True)
        plain = self.w._claim_tasks is None or bool(self.w._claim_tasks)
        first = self._flow_first[index] = not self._flow_first.get(index, False)
        now = time.monotonic()
        if not plain or now < self._plain_rest or (first and now >= self._flow_rest):
            if plain and self._flow_empty:
                # the rest after an empty flow claim is over: this slot looks again, and the others
                # keep to plain claims meanwhile (not a burst of empty flow claims, one per slot)
                self._flow_rest = now + self._flow_rest_after(flow)
            claimed, turn = self._flow_claim(flow, lease, size, executor, index)
            if claimed or not plain:
                return claimed, turn
            # none: the process's next claims are plain ones for a moment (while they find work, a
            # flow claim that finds nothing would double their round trips); an empty plain claim
            # still tries the flow claim at once (below)
            self._flow_empty += 1
            self._flow_walk = self._took.get(index, 0.0)
            self._flow_rest = now + self._flow_rest_after(flow)
            return self._plain_claim(lease, size, executor, index)
        if self._plain_empty:  # likewise: one slot looks again after the rest, the others keep on
            self._plain_rest = now + self._plain_rest_after()
        claimed, turn = self._plain_claim(lease, size, executor, index)
        if claimed:
            return claimed, turn
        lease.let_go()
        # none: likewise, the process's next claims are flow claims for a moment (while they find
        # work, a plain claim that finds nothing first would double their round trips and batch turns)
        self._plain_empty, self._plain_walk = True, self._took.get(index, 0.0)
        self._plain_rest = now + self._plain_rest_after()
        return self._flow_claim(flow, lease, size, executor, index)

    def _plain_rest_after(self) -> float:
        """How long no plain claim goes first after one found nothing: PLAIN_REST_SECONDS, or longer
        when that claim's walk took more than WALK_SHARE of it."""
        return max(PLAIN_REST_SECONDS, self._plain_walk / WALK_SHARE)

    def _flow_rest_after(self, flow: FlowControl) -> float:
        """How long no flow claim goes first after ``_flow_empty`` empty ones in a row: doubling from
        FLOW_REST_SECONDS up to PLAIN_REST_SECONDS, or longer when the last one's walk took more than
        WALK_SHARE of it, and not past the time a key held back by its rate may start again."""
        rest = min(FLOW_REST_SECONDS * 2 ** min(max(self._flow_empty - 1, 0), 16), PLAIN_REST_SECONDS)
        rest = max(rest, self._flow_walk / WALK_SHARE)
        due = flow.next_due()
        return rest if due is None else min(rest, max(due, FLOW_REST_SECONDS))

    def _flow_claim(self, flow: FlowControl, lease: "Lease", size: ClaimSize, executor: Executor,
                    index: int) -> tuple[list[Any], bool]:
        """Flow-controlled jobs (worker/flow.py): up to ``size`` of them, as the plain claim's batches
        (a batch turn, the same policy), with one slot of each of their keys. A claim that got any job
        wakes two idle slots to look too (there may be more), as after a full plain claim."""
        # a job with a rate is claimed alone (worker/flow.py): after one, this slot claims one job
        # (no batch turn to wait for) until it takes a job without a rate
        if index in flow.rated_slots:
            limit, turn = 1, False
            self.limits[index] = limit
        else:
            limit, turn = self._take_turn(size, index, flow=True)
        if limit == 0:
            return [], False
        try:
            claimed = self._traced(index, "skiplock flow claim",
                                   lambda: flow.claim(lease, executor.bookkeeping, index, limit, executor.alone))
            if limit > 1 and len(claimed) == 1 and executor.alone(claimed[0].task):
                size.alone()  # a fair batch let go in the flow claim (it keeps the round's place)
            elif len(claimed) > 1 and executor.alone(claimed[0].task):
                # A job that runs alone came first: let the others (and their slots) go at once, take one.
                size.alone()
                lease.let_go()
                claimed = flow.claim(lease, executor.bookkeeping, index, 1)
        except BaseException:
            if turn:
                self.w.batching.give_turn(index)
            raise
        if claimed:
            self._flow_empty, self._flow_rest = 0, 0.0
            self.w.wake(every=False, slots=2)
        if turn and len(claimed) <= 1:  # no batch to run: the turn is someone else's
            self.w.batching.give_turn(index)
            turn = False
        return claimed, turn

    def _read_view(self, lease: "Lease", view: QueueView) -> tuple[list[str], list[str]]:
        """``claimable_queues`` on the slot's lease (worker/queue_view.py)."""
        return cast("QueueViewBackend", self.w.app.backend).claimable_queues(lease, view.most)

    def _view_queues(self, lease: "Lease", view: QueueView) -> list[str] | None:
        """The queues the view names now (None: every queue), read first when it is due."""
        if view.take_read():
            return view.update(*self._read_view(lease, view))
        return view.named

    def _traced(self, index: int, span_name: str, claim: Callable[[], list[Any]]) -> list[Any]:
        """``claim()``, inside its span when tracing is on (observability/tracing.py): the jobs
        claimed are its attribute. How long it took is the slot's ``_took`` (see WALK_SHARE)."""
        tracing = self.w.app.tracing
        started = time.monotonic()
        try:
            if tracing is None:
                return claim()
            with tracing.claim(f"{self.w.name}/{index}", span_name) as span:
                claimed = claim()
                span.set_attribute("skiplock.claimed", len(claimed))
                return claimed
        finally:
            self._took[index] = time.monotonic() - started

    def _take_turn(self, size: ClaimSize, index: int, flow: bool = False, side: bool = False) -> tuple[int, bool]:
        """How many jobs this claim may take, and whether it holds a batch turn (see ``batch_slots``;
        a ``flow`` claim's are ``flow_batch_slots``); (0, False): the worker is stopping. A batch
        that runs ``side`` by side takes no turn (turns are for batches of near-instant jobs run one
        after another; a slot waiting for one is not idle, and could not take batch-mates handed out)."""
        limit = self.w.batching.share(size, self.w.idle_slots)
        self.limits[index] = limit
        turn = limit > 1 and size.instant and not side
        if turn:
            turn = self.w.batching.take_turn(index, self.w._stopping, flow)
            if not turn:
                limit = 1
            if self.w._stopping.is_set():
                if turn:
                    self.w.batching.give_turn(index)
                return 0, False
        return limit, turn

    def _plain_claim(self, lease: "Lease", size: ClaimSize, executor: Executor, index: int,
                     only: bool = False) -> tuple[list[Any], bool]:
        """The plain claim (no flow control): up to ``size`` jobs of the unlimited tasks. ``only``: no
        flow claim is in play, so a claim that comes back short found every job available to the
        worker (``found_all``)."""
        # Side by side: the whole claim size, its jobs handed to the slots idle meanwhile (side_by_side.py).
        side = self.side[index] = plan(self.w.batching, size)
        if side and self.w._sleeping:
            limit, turn = size.value, False
            self.limits[index] = limit
        else:  # (no slot idle: sized as before; its jobs go to the slots that go idle meanwhile)
            limit, turn = self._take_turn(size, index, side=side)
            if limit == 0:
                return [], False
        backend, tasks, view = self.w.app.backend, self.w._claim_tasks, self.w.queue_view
        try:
            lease.begin()
            # a worker of every queue names the queues with jobs while one is paused (queue_view.py)
            queues = self.w.queues if view is None else self._view_queues(lease, view)
            claimed = self._traced(index, "skiplock claim", lambda: backend.claim(lease, queues, limit, tasks=tasks))
            if not claimed and queues is not None and view is not None:
                # a queue that got jobs since the view was read (or was resumed): read it again, and
                # claim again if it names other queues now
                again = view.update(*self._read_view(lease, view))
                if again != queues:
                    queues = again
                    claimed = backend.claim(lease, queues, limit, tasks=tasks)
            if len(claimed) > 1 and executor.alone(claimed[0].task):
                # A job that runs alone came first: let the others go at once, take one.
                size.alone()
                lease.let_go()
                lease.begin()
                claimed = backend.claim(lease, queues, 1, tasks=tasks)
            else:
                self.found_all[index] = only and len(claimed) < limit
        except BaseException:
            if turn:
                self.w.batching.give_turn(index)
            raise
        if claimed and self._plain_empty:  # plain jobs again (also after an empty flow claim): no rest
            self._plain_empty, self._plain_rest = False, 0.0
        if claimed and log.isEnabledFor(logging.DEBUG):
            log.debug("slot %s/%s claimed %d job(s) (ids %s..%s, limit %d)", self.w.name, index, len(claimed),
                      claimed[0].id, claimed[-1].id, limit)
        if turn and len(claimed) <= 1:  # no batch to run: the turn is someone else's
            self.w.batching.give_turn(index)
            turn = False
        return claimed, turn
