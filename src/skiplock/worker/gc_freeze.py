"""Python's cyclic garbage collector kept out of the way of pickups (``freeze_startup_objects``).

Why. A worker process holds a few hundred thousand objects that live as long as it does: modules,
classes, the app and its tasks, the connection pools. CPython's collection of its oldest generation
walks every one of them, holding the GIL: every slot stops meanwhile. Measured on 2 cores, 1 x 16
slots, 1 ms jobs offered at 1,800 jobs/s (docs/benchmarks.md, "Session 25"): five such collections
in ten seconds, each pausing the process for up to 23-34 ms, and the pickups they caught made the
p99 (25.6-33.1 ms); with the objects alive at start frozen, 15.8-17.3 ms.

What it does: once per process, as a worker starts (its modules imported, its pools and services
up; before its slots claim), ``gc.collect()`` and then ``gc.freeze()``: the objects alive then move to the
permanent generation, which no later collection walks. Nothing else changes. They are still freed
by reference counting when no longer used; only a reference cycle among them that becomes garbage
later is never collected -- bounded by what existed at the start.

On by default for ``skiplock worker`` (its process is the worker's; ``--no-freeze-gc`` turns it off),
off by default for ``app.worker()`` (``freeze_gc=True``), whose process may be someone else's.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger("skiplock.worker")

_lock = threading.Lock()
_done = False


def freeze_startup_objects() -> bool:
    """Collect, then freeze every object alive now (see the module docstring); once per process.
    True if this call did it."""
    global _done
    with _lock:
        if _done:
            return False
        _done = True
        began = time.perf_counter()
        gc.collect()
        gc.freeze()
    log.debug("%d objects alive at start frozen out of the garbage collector's walks (%.1f ms)",
              gc.get_freeze_count(), (time.perf_counter() - began) * 1000)
    return True
