"""Loads the named statements of queries.sql and the numbered migrations, with the schema bound."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from psycopg import sql

# A block is a named statement (``-- name: x``) or a fragment (``-- fragment: x``): SQL text that
# statements include where a line says ``-- include: x`` (its lines in place of that one).
_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.M)
_INCLUDE = re.compile(r"^-- include: (\w+)\s*$", re.M)


def schema_identifier(schema: str) -> str:
    """``schema`` as SQL text: psycopg's identifier quoting (``sql.Identifier``), and never a "%".

    The statements are plain strings run both with parameters (psycopg then reads every "%" as a
    placeholder: ``"we%ird"`` breaks the statement) and without (a "%%" escape would then reach the
    server as two characters: another schema). So a name with "%" is written as PostgreSQL's
    Unicode-escape identifier, ``U&"we\\0025ird"``: the same name, no "%" in the text, correct in
    both cases (and in COPY and the migrations). Other names keep the plain quoted form."""
    return identifier_text(schema)


def identifier_text(*names: str) -> str:
    """A (qualified) identifier as SQL text without "%" (see :func:`schema_identifier`): each part
    quoted by ``sql.Identifier``, a part with "%" written as a Unicode-escape identifier."""
    parts = []
    for name in names:
        quoted = sql.Identifier(name).as_string(None)  # type: ignore[arg-type]  # no connection needed
        parts.append("U&" + quoted.replace("\\", "\\\\").replace("%", "\\0025") if "%" in quoted else quoted)
    return ".".join(parts)


def _bind_schema(text: str, schema: str) -> str:
    # The result is plain SQL with %(param)s placeholders and the schema bound (see schema_identifier).
    return sql.SQL(text).format(schema=sql.SQL(schema_identifier(schema))).as_string(None)  # type: ignore[arg-type]


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _blocks(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(statements, fragments) of a .sql file, by name, as written (comments and includes kept)."""
    parts = _BLOCK.split(text)
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        found = statements if kind == "name" else fragments
        if name in statements or name in fragments:
            raise ValueError(f"SQL block {name!r} is defined twice")
        found[name] = body
    return statements, fragments


def _include(body: str, fragments: dict[str, str], within: str) -> str:
    def fragment(match: "re.Match[str]") -> str:
        name = match.group(1)
        if name not in fragments:
            raise ValueError(f"SQL block {within!r} includes {name!r}, which no '-- fragment:' defines")
        return fragments[name].strip("\n")

    return _INCLUDE.sub(fragment, body)


@lru_cache(maxsize=None)
def load_queries(schema: str, file: str = "queries.sql") -> dict[str, str]:
    """name -> SQL for every ``-- name:`` block in ``file`` (queries.sql by default), its
    ``-- include:`` lines replaced by the ``-- fragment:`` blocks they name, schema bound."""
    statements, fragments = _blocks(_read(file))
    out: dict[str, str] = {}
    for name, body in statements.items():
        body = _include(body, fragments, name)
        # comments stay in the file for readers; the server gets the statement alone
        code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
        out[name] = _bind_schema(code.strip(), schema)
    return out


# A claim's `LIMIT %(limit)s`, bound as an integer literal by `with_limit` (see there).
LIMIT_PLACEHOLDER = "LIMIT %(limit)s"
# The literal forms kept: powers of two up to this (a worker's claim sizes), so a connection holds
# at most a dozen prepared texts of each claim.
MAX_LITERAL_LIMIT = 1024


def complete_statement(owner: object | None) -> str:
    """The named statement that writes a job ``done``: ``complete`` under the transaction lease (no
    owner: the row lock is the fence), ``complete_claimed`` under the claimed lease (fenced on
    ``owner``). Two texts, so the server keeps one plan for each (queries.sql)."""
    return "complete" if owner is None else "complete_claimed"


def with_limit(statement: str, limit: int) -> str:
    """``statement`` (a claim ending in ``LIMIT %(limit)s``) with that limit written as an integer
    literal when it is a power of two up to ``MAX_LITERAL_LIMIT`` -- a worker's claim sizes -- and
    unchanged otherwise (the ``limit`` parameter then still applies; passing it either way is fine).

    Why: the server plans a prepared statement's first five runs for their values (custom plans),
    then keeps one plan for every value (the generic plan) only if that plan looks no costlier. With
    the limit a parameter, the generic plan assumes it returns a tenth of the rows, so it always
    looked costlier, and every claim was planned anew -- 0.2-0.25 ms of server CPU per claim, more
    than running it (docs/benchmarks.md, "Session 12"). With a literal limit the generic plan costs
    what the custom ones do and is kept. It is the same ordered walk of the claim index (the EXPLAIN
    tests of tests/integration/test_claim_protocol.py check the generic plan of each form)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LITERAL_LIMIT \
            or limit & (limit - 1):
        return statement
    return _literal_limit(statement, limit)


# A claim over this many given queues or fewer merges each queue's own walk (`claim_of_queues_merged`
# in queries.sql); over more, it walks jobs_claim_any_idx (`claim_of_queues`): a descent per queue
# and claim against a heap read per job of another queue waiting ahead.
MERGED_QUEUES_MAX = 16
_EACH_QUEUE = "/* each queue */"


def claim_of_queues(q: dict[str, str], prefix: str, queues: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """The claim over the given ``queues`` (``prefix``: "claim" or "claim_tasks") and its queue
    parameters, by the number of distinct names: one, the claim of one queue (``{prefix}``); up to
    ``MERGED_QUEUES_MAX``, each queue's walk (``{prefix}_queue_walk``) merged
    (``claim_of_queues_merged``); more, the walk of jobs_claim_any_idx (``{prefix}_of_queues``).
    The caller adds ``limit`` (and ``tasks``) to the parameters."""
    distinct = list(dict.fromkeys(queues))  # a queue named twice would be merged with itself
    if len(distinct) == 1:
        return q[prefix], {"queue": distinct[0]}
    if len(distinct) > MERGED_QUEUES_MAX:
        return q[f"{prefix}_of_queues"], {"queues": distinct}
    return (_merged(q["claim_of_queues_merged"], q[f"{prefix}_queue_walk"], len(distinct)),
            {f"queue_{i}": name for i, name in enumerate(distinct)})


@lru_cache(maxsize=None)  # two walks x the worker's queue count
def _merged(frame: str, walk: str, n: int) -> str:
    """``frame`` with its ``/* each queue */`` replaced by ``n`` copies of ``walk``, each in
    parentheses (its own ORDER BY: an ordered input of the Merge Append) with its ``%(queue)s``
    renamed ``%(queue_<i>)s``, joined by UNION ALL."""
    if frame.count(_EACH_QUEUE) != 1:
        raise ValueError("a merged claim needs one '/* each queue */' in its FROM")
    walks = "\n UNION ALL\n".join(f"({walk.replace('%(queue)s', f'%(queue_{i})s')})" for i in range(n))
    return frame.replace(_EACH_QUEUE, walks)


def int_array(values: Sequence[int]) -> str:
    """Integers as one PostgreSQL array literal, ``{1,2,3}`` (a text parameter cast to ``bigint[]`` or
    ``int[]`` in the statement): digits and commas only, so nothing needs quoting. Cheaper for the
    worker than psycopg's list dumper, which looks at every element to pick the array's type (see
    the top of queries.sql). ``values`` must be ints: anything else is a bug, refused here."""
    for v in values:
        if v.__class__ is not int:
            raise TypeError(f"int_array: {v!r} is not an int")
    return "{" + ",".join(map(str, values)) + "}"


@lru_cache(maxsize=64)  # a worker's task names: the same tuple at every claim
def text_array(values: tuple[str, ...]) -> str:
    """Texts as one PostgreSQL array literal (a text parameter cast to ``text[]`` in the statement):
    each element in double quotes, its backslashes and double quotes escaped with a backslash -- the
    array syntax's whole quoting rule, so any name round-trips. Cached: a claim names the worker's
    tasks at every run, and psycopg's list dumper quoted them anew each time (15-35 µs of the
    worker's CPU per claim, for 3-20 names)."""
    for v in values:
        if v.__class__ is not str:
            raise TypeError(f"text_array: {v!r} is not a str")
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def json_array(values: Sequence[str | None]) -> str:
    """JSON texts (each already valid JSON, as ``values.to_json`` writes it; None: no value) as one
    JSON array, ``[t1,t2,...]``, None as ``null`` (see ``complete_batch`` in queries.sql)."""
    return "[" + ",".join("null" if v is None else v for v in values) + "]"


def prepare_now(conn: Any) -> bool | None:
    """The ``prepare`` argument of the execute of a claim or a batch's finishing write: True (a
    prepared statement from its first run) unless the connection prepares nothing
    (``prepare_threshold=None``: behind a transaction pooler).

    Why: psycopg prepares a statement only at its sixth run on a connection, so each claim text
    (a claim kind x a literal limit, ``with_limit``) was planned at each of its first five runs on
    every lease connection -- a flow claim at 1-2 ms of server CPU a plan. Those that run under
    ``force_generic_plan`` (the flow claims, ``complete_batch``) are now planned once per text and
    connection; the others still get the server's five custom plans first. Measured on a drain of
    20,000 flow-limited jobs, 1 process x 8 slots (pg_stat_statements): 188 plans of the flow claim
    in 743 runs, 72 with this (docs/benchmarks.md, "Session 21")."""
    return None if conn.prepare_threshold is None else True


@lru_cache(maxsize=None)  # a few claim texts x a dozen limits
def _literal_limit(statement: str, limit: int) -> str:
    if statement.count(LIMIT_PLACEHOLDER) != 1:
        raise ValueError("with_limit needs a statement with exactly one LIMIT %(limit)s")
    return statement.replace(LIMIT_PLACEHOLDER, f"LIMIT {int(limit)}")


@lru_cache(maxsize=None)
def load_migrations(schema: str) -> tuple[str, list[tuple[int, str]]]:
    """(bootstrap SQL, [(version, SQL), ...] in version order)."""
    folder = resources.files(__package__).joinpath("migrations")
    numbered: list[tuple[int, str]] = []
    bootstrap = ""
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        version = int(entry.name.split("_", 1)[0])
        body = _bind_schema(entry.read_text(encoding="utf-8"), schema)
        if version == 0:
            bootstrap = body
        else:
            numbered.append((version, body))
    return bootstrap, numbered


def latest_version(schema: str = "skiplock") -> int:
    return load_migrations(schema)[1][-1][0]
