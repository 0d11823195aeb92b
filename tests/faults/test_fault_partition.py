"""A network partition between a worker and the server, through a TCP proxy that stalls.

The partitioned worker reaches PostgreSQL only through :class:`faults_support.StallProxy` (every
connection: leases, pool, heartbeats, listener) and serves the queue ``p``; it starts one job of each
lease mode there. Mid-job the proxy stops forwarding in both directions (sockets stay open). A healthy
worker serving another queue is already running (its rescuer, like every worker's, watches all
queues); a second healthy worker serving ``p`` starts at the stall to redo the jobs. Invariants: each
job returns to the queue within a stated bound (asserted), is redone by the healthy worker and is
finished exactly once (one committed effect, by the healthy worker, on attempt 2); when the partition
heals, the stale worker's late writes are refused and it carries on.

What bounds it, honestly: the proxy's kernel ACKs data and answers keepalive probes, so the server's
TCP keepalives, ``tcp_user_timeout`` and ``client_connection_check_interval`` (all set by skiplock on
lease sessions) cannot see this partition -- they catch a peer whose host is gone or a closed socket,
not a stalled process behind a live TCP stack. What ends the stale lease here is skiplock's lease
transaction bound: ``App(lease_timeout=...)`` sets ``idle_in_transaction_session_timeout`` (and
``transaction_timeout`` on PostgreSQL 17+) on lease sessions, so the server ends the transaction
lease within ``lease_timeout`` of the worker's last statement. A claimed lease is bounded by
``lease_seconds`` (heartbeats stop getting through) plus the rescuer's interval.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from faults_support import (NetnsLink, StallProxy, executions, record, scalar, states_of, verdict, wait_for,
                            wait_ready)

LEASE_TIMEOUT = 3.0  # App(lease_timeout=...) of the workers
LEASE_SECONDS = 2.0  # the claimed task's lease
RESCUE_INTERVAL = 0.5
JOB_SECONDS = 2.0  # each job's first attempt: within both bounds, so without the partition it would finish
SLACK = 2.0  # scheduling and polling allowance on top of each stated bound
# Stated bounds, measured from the moment the proxy stalls:
TXN_RELEASED_WITHIN = LEASE_TIMEOUT + SLACK  # the server has ended the stale lease: the job is claimable
CLAIMED_RESCUED_WITHIN = LEASE_SECONDS + RESCUE_INTERVAL + SLACK  # a rescuer has put it back in the queue

ENV = {"FAULTS_LEASE_TIMEOUT": str(LEASE_TIMEOUT), "FAULTS_LEASE_SECONDS": str(LEASE_SECONDS),
       "FAULTS_RESCUE_INTERVAL": str(RESCUE_INTERVAL)}


# The server-side TCP settings skiplock puts on lease sessions (backend.py, connect_lease):
# tcp_keepalives_idle 10 s, tcp_keepalives_interval 5 s, tcp_keepalives_count 3, tcp_user_timeout 30 s.
# On Linux, TCP_USER_TIMEOUT overrides the keepalive count when both are set (tcp(7)): a silent peer of
# an idle session is declared dead at the first keepalive probe once 30 s have passed without hearing
# from it -- after 30-35 s, not after idle + count * interval = 25 s.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT, USER_TIMEOUT = 10, 5, 3, 30
DEAD_PEER_EARLIEST = KEEPALIVE_IDLE + KEEPALIVE_COUNT * KEEPALIVE_INTERVAL  # 25 s
DEAD_PEER_LATEST = max(DEAD_PEER_EARLIEST, USER_TIMEOUT) + KEEPALIVE_INTERVAL  # 35 s


@pytest.fixture
def proxy(fault_server):
    p = StallProxy(fault_server.port)
    yield p
    p.close()


@pytest.fixture
def veth(fault_server):
    """A network namespace linked to the host by a veth pair, and the suite's server listening on the
    host end too (restarted back to 127.0.0.1 only afterwards)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a real partition needs root and iproute2 (network namespaces)")
    link = NetnsLink(os.getpid())
    link.remove()  # a leftover of a killed run with the same pid
    try:
        link.up()
    except (RuntimeError, OSError) as exc:
        link.remove()
        pytest.skip(f"cannot create a network namespace here: {exc}")
    try:
        hba = fault_server.data_dir / "pg_hba.conf"
        line = "host all all 10.213.0.0/16 trust  # skiplock fault suite: workers in network namespaces\n"
        if line not in hba.read_text():
            with hba.open("a") as f:  # appending keeps the file's owner
                f.write(line)
        fault_server.stop("fast")
        fault_server.start(f"-c listen_addresses=127.0.0.1,{link.host_ip}")
        yield link
    finally:
        link.remove()
        fault_server.stop("fast")
        fault_server.start()


def test_partition_between_worker_and_server(fault_server, fault_db_name, fdsn, fdb, producer, workers,
                                             exec_dir, proxy):
    started = time.monotonic()
    bystander = workers.start(fdsn, concurrency=1, env=ENV, extra=["--queues", "elsewhere"])
    partitioned = workers.start(fault_server.tcp_dsn(fault_db_name, port=proxy.port), concurrency=2, env=ENV,
                                extra=["--queues", "p"])
    wait_ready(fdb, bystander)
    txn_id = producer.enqueue("txn_effect", {"sleep_first": JOB_SECONDS}, queue="p")
    claimed_id = producer.enqueue("claimed_effect", {"sleep_first": JOB_SECONDS}, queue="p")
    ids = [txn_id, claimed_id]
    wait_for(lambda: {j for j, _, p in executions(exec_dir) if p == partitioned.pid} == set(ids), 30,
             "the partitioned worker to start both jobs", on_timeout=partitioned.tail)
    lease_pid = scalar(fdb, "SELECT backend_pid FROM skiplock.job_attempts WHERE job_id = %s", [txn_id])
    assert lease_pid, "the transaction-lease job's session is unknown"

    proxy.stall()
    stalled_at = time.monotonic()
    healthy = workers.start(fdsn, concurrency=2, env=ENV, extra=["--queues", "p"])

    def txn_released() -> bool:
        return not scalar(fdb, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [lease_pid])

    def claimed_rescued() -> bool:
        return scalar(fdb, "SELECT state <> 'running' OR worker NOT LIKE %s FROM skiplock.jobs WHERE id = %s",
                      [partitioned.slot_pattern, claimed_id])

    seen: dict[str, float] = {}
    deadline = stalled_at + 60  # a safety net: the bounds are asserted below, on the measured times
    while len(seen) < 3 and time.monotonic() < deadline:
        now = time.monotonic() - stalled_at
        if "txn lease ended" not in seen and txn_released():
            seen["txn lease ended"] = now
        if "claimed rescued" not in seen and claimed_rescued():
            seen["claimed rescued"] = now
        if "both redone" not in seen and scalar(
                fdb, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'", [ids]) == 2:
            seen["both redone"] = now
        time.sleep(0.02)
    assert proxy.stalled  # the partition held the whole time
    proxy.heal()

    # The stale worker's late writes: the claimed job's fenced finishing write is refused; the
    # transaction-lease job's connection was ended by the server, so its completion fails.
    wait_for(lambda: "lost its lease" in partitioned.output(), 30, "the stale claimed-lease write to be refused",
             on_timeout=partitioned.tail)
    wait_for(lambda: "reconnected to the database" in partitioned.output(), 30,
             "the stale transaction-lease slot to reconnect (the server ended its session)",
             on_timeout=partitioned.tail)
    alive = partitioned.alive()
    codes = workers.stop_all([partitioned, healthy, bystander], fdb)
    elapsed = time.monotonic() - started

    v_txn, v_claimed = verdict(fdb, [txn_id], exec_dir), verdict(fdb, [claimed_id], exec_dir)
    times = ", ".join(f"{k} {t:.1f}s" for k, t in seen.items())
    record("network partition (stalling proxy)", "transaction", v_txn, "1 partition", elapsed,
           note=f"after the stall: {times}; bound lease_timeout {LEASE_TIMEOUT:g}s + {SLACK:g}s")
    record("network partition (stalling proxy)", "claimed", v_claimed, "1 partition", elapsed,
           note=f"after the stall: {times}; bound lease_seconds {LEASE_SECONDS:g}s + rescuer "
                f"{RESCUE_INTERVAL:g}s + {SLACK:g}s")

    assert seen.get("txn lease ended", 1e9) <= TXN_RELEASED_WITHIN, (seen, TXN_RELEASED_WITHIN)
    assert seen.get("claimed rescued", 1e9) <= CLAIMED_RESCUED_WITHIN, (seen, CLAIMED_RESCUED_WITHIN)
    assert "both redone" in seen, (seen, states_of(fdb, ids), healthy.tail())
    for v in (v_txn, v_claimed):
        assert v.problems() == [] and v.states == {"done": 1}, (v.problems(), v.states)
    # Finished once, by the healthy worker; the stale first attempt left nothing. The claimed-lease
    # job's first attempt was counted at its claim; the transaction-lease job's never finished and
    # shared its process with another job, so it was not charged (docs/guarantees.md): attempt 1 again.
    effects = fdb.execute("SELECT job_id, attempt, pid FROM effects ORDER BY job_id").fetchall()
    assert effects == [(txn_id, 1, healthy.pid), (claimed_id, 2, healthy.pid)], effects
    results = dict(fdb.execute("SELECT id, result FROM skiplock.jobs WHERE id = ANY(%s)", [ids]).fetchall())
    assert results == {txn_id: {"pid": healthy.pid, "attempt": 1}, claimed_id: {"pid": healthy.pid, "attempt": 2}}, \
        results
    errors = scalar(fdb, "SELECT errors::text FROM skiplock.jobs WHERE id = %s", [claimed_id])
    assert "lease expired" in errors, errors
    assert alive, partitioned.tail()
    assert set(codes.values()) == {0}, (codes, partitioned.tail())


def test_real_partition_the_server_notices_the_dead_client(veth, fault_server, fault_db_name, fdsn, fdb, producer,
                                                            workers, exec_dir):
    # (``veth`` first: it restarts the server, which must happen before ``fdb`` connects)
    """A real partition: the worker runs in a network namespace and reaches the server over a veth
    link, which is taken down mid-job (packets dropped both ways, nothing answers), and never comes
    back, as if the worker's host had vanished. No lease_timeout shortcut here (the default 600 s):
    the transaction lease must be ended by the server's TCP settings that skiplock puts on lease
    sessions: keepalive probes (idle 10 s, every 5 s), with tcp_user_timeout (30 s) deciding when the
    silent peer is dead -- after 30-35 s here (client_connection_check_interval only acts while a
    query runs; this session is idle in transaction). The claimed lease is bounded by lease_seconds
    plus the rescuer, as always."""
    env = {"FAULTS_LEASE_SECONDS": str(LEASE_SECONDS), "FAULTS_RESCUE_INTERVAL": str(RESCUE_INTERVAL)}
    started = time.monotonic()
    bystander = workers.start(fdsn, concurrency=1, env=env, extra=["--queues", "elsewhere"])
    remote = workers.start(fault_server.tcp_dsn(fault_db_name).replace("127.0.0.1", veth.host_ip), concurrency=2,
                           env=env, extra=["--queues", "p"], prefix=veth.exec_prefix)
    wait_ready(fdb, bystander)
    txn_id = producer.enqueue("txn_effect", {"sleep_first": 3.0}, queue="p")
    claimed_id = producer.enqueue("claimed_effect", {"sleep_first": 3.0}, queue="p")
    ids = [txn_id, claimed_id]
    wait_for(lambda: {j for j, _, p in executions(exec_dir) if p == remote.pid} == set(ids), 30,
             "the worker in the namespace to start both jobs", on_timeout=remote.tail)
    lease_pid = scalar(fdb, "SELECT backend_pid FROM skiplock.job_attempts WHERE job_id = %s", [txn_id])
    assert scalar(fdb, "SELECT host(client_addr) FROM pg_stat_activity WHERE pid = %s", [lease_pid]) == veth.ns_ip

    veth.cut()
    cut_at = time.monotonic()
    healthy = workers.start(fdsn, concurrency=2, env=env, extra=["--queues", "p"])
    seen: dict[str, float] = {}
    deadline = cut_at + DEAD_PEER_LATEST + 30  # a safety net; the bounds are asserted on measured times
    while len(seen) < 3 and time.monotonic() < deadline:
        now = time.monotonic() - cut_at
        if "txn lease ended" not in seen and not scalar(
                fdb, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [lease_pid]):
            seen["txn lease ended"] = now
        if "claimed rescued" not in seen and scalar(
                fdb, "SELECT state <> 'running' OR worker NOT LIKE %s FROM skiplock.jobs WHERE id = %s",
                [remote.slot_pattern, claimed_id]):
            seen["claimed rescued"] = now
        if "both redone" not in seen and scalar(
                fdb, "SELECT count(*) FROM skiplock.jobs WHERE id = ANY(%s) AND state = 'done'", [ids]) == 2:
            seen["both redone"] = now
        time.sleep(0.05)
    remote.signal(signal.SIGKILL)  # the vanished host never comes back
    remote.wait()
    codes = workers.stop_all([healthy, bystander], fdb)
    elapsed = time.monotonic() - started

    v_txn, v_claimed = verdict(fdb, [txn_id], exec_dir), verdict(fdb, [claimed_id], exec_dir)
    times = ", ".join(f"{k} {t:.1f}s" for k, t in seen.items())
    record("real partition (veth link down)", "transaction", v_txn, "1 link cut", elapsed,
           note=f"after the cut: {times}; bound: keepalives + tcp_user_timeout, {DEAD_PEER_EARLIEST}-"
                f"{DEAD_PEER_LATEST}s (+ {SLACK:g}s)")
    record("real partition (veth link down)", "claimed", v_claimed, "1 link cut", elapsed,
           note=f"after the cut: {times}; bound lease_seconds {LEASE_SECONDS:g}s + rescuer "
                f"{RESCUE_INTERVAL:g}s + {SLACK:g}s")

    # Not before the keepalives could have fired (nothing else ended it), and within the stated bound.
    assert DEAD_PEER_EARLIEST - SLACK <= seen.get("txn lease ended", 1e9) <= DEAD_PEER_LATEST + SLACK, seen
    assert seen.get("claimed rescued", 1e9) <= CLAIMED_RESCUED_WITHIN, seen
    assert "both redone" in seen, (seen, states_of(fdb, ids), healthy.tail())
    for v in (v_txn, v_claimed):
        assert v.problems() == [] and v.states == {"done": 1}, (v.problems(), v.states)
    effects = fdb.execute("SELECT job_id, attempt, pid FROM effects ORDER BY job_id").fetchall()
    assert effects == [(txn_id, 1, healthy.pid), (claimed_id, 2, healthy.pid)], effects  # as above
    assert set(codes.values()) == {0}, codes


def test_lease_ended_by_the_server_is_logged_as_a_lost_connection(fdsn, fdb, producer, workers, exec_dir):
    """The behaviour is right (the job is redone, finished once); the report of it is not."""
    w = workers.start(fdsn, concurrency=1, env={"FAULTS_LEASE_TIMEOUT": "1"})
    job_id = producer.enqueue("txn_effect", {"sleep_first": 2.0})  # idle in its lease past lease_timeout
    wait_for(lambda: scalar(fdb, "SELECT state FROM skiplock.jobs WHERE id = %s", [job_id]) == "done", 30,
             "the job to be redone", on_timeout=w.tail)
    assert fdb.execute("SELECT attempt FROM effects WHERE job_id = %s", [job_id]).fetchall() == [(2,)]
    log = w.output()
    workers.stop_all([w], fdb)
    assert "unexpected error" not in log and "database connection lost" in log, log[-3000:]
