"""Pages of a list, by keyset: what every list of the read model (and the dashboard) returns.

Guarantees: a list comes a page at a time (:class:`Page`); ``page.cursor``, passed back as ``after=``,
names the last key of the page, and the next page starts strictly after it (keyset pagination, never
OFFSET), so rows added or removed meanwhile never make a page repeat or skip a row that stayed. A
cursor names the list it belongs to: a cursor of another list, or anything that is not a cursor, is
refused with a ValueError, as is a page size that is not an integer from 1 to ``MAX_PAGE``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

MAX_PAGE = 10_000


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list. ``cursor``: pass it back as ``after=`` for the next page; None when this
    page is the last (it came back short, and no window of a search is left: see ``searched_from``)."""

    items: list[T]
    cursor: str | None
    # A search that reads one window of ids at a time (an args-text search: :meth:`JobReads.find_jobs`)
    # read the ids from this one up: a page may then come back short with a cursor (the next window).
    searched_from: int | None = None

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
    return limit


def read_cursor(after: Any, what: str) -> Any:
    """The key a cursor names (as :func:`make_cursor` wrote it), or a clear error."""
    if after is None:
        return None
    try:
        kind, key = json.loads(after) if isinstance(after, str) else (None, None)
    except (ValueError, TypeError):
        kind, key = None, None
    if kind != what:
        raise ValueError(f"not a cursor of {what}: {after!r} (pass back the cursor of a page of {what})")
    return key


def make_cursor(what: str, key: Any) -> str:
    return json.dumps([what, key], separators=(",", ":"))


def id_page(kind: str, after: str | None, limit: int, fetch: Callable[[int | None, int], list[tuple[Any, ...]]],
             make: Callable[[tuple[Any, ...]], T], id_field: str) -> "Page[T]":
    """A page of rows keyed by one integer id: the cursor ``after`` (of this ``kind``) checked, the rows
    fetched after it, and the next cursor if the page is full."""
    key = read_cursor(after, kind)
    if key is not None and (isinstance(key, bool) or not isinstance(key, int)):
        raise ValueError(f"not a cursor of {kind}: {after!r}")
    items = [make(row) for row in fetch(key, check_limit(limit))]
    return Page(items, make_cursor(kind, getattr(items[-1], id_field)) if len(items) == limit else None)


def all_pages(fetch: Any, limit: int = 1000) -> list[Any]:
    """Every item of a paged list: ``fetch(limit=..., after=...)`` called until a page comes back short."""
    out: list[Any] = []
    after: str | None = None
    while True:
        page = fetch(limit=limit, after=after)
        out.extend(page.items)
        if page.cursor is None:
            return out
        after = page.cursor
