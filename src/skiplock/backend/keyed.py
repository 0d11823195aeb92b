"""``enqueue_many`` with unique keys, what every backend does before any I/O: in-call duplicates."""

from __future__ import annotations

from typing import Mapping

from ..errors import DuplicateJob


def same_keys(keyed: Mapping[int, tuple[str, str]]) -> dict[int, int]:
    """{later item: the first item with its key}; each key is sent once, with its first item. A later
    item with ``on_conflict="raise"`` is refused here (DuplicateJob with ``existing_id`` None: the job
    it duplicates would be this call's own), before anything is sent."""
    first: dict[str, int] = {}
    same_as: dict[int, int] = {}
    for i in sorted(keyed):
        key, on_conflict = keyed[i]
        j = first.setdefault(key, i)
        if j != i:
            if on_conflict == "raise":
                raise DuplicateJob(f"item {i}: unique_key {key!r} is also item {j}'s, and on_conflict='raise'; "
                                   "nothing was enqueued", None)
            same_as[i] = j
    return same_as
