"""The verifiers' PostgreSQL dialect (``skiplock scenario`` and ``skiplock demo``, tools/dialect.py).

A verifier checks the queue's promises with its own SQL on its own psycopg connections,
independently of the backend port it checks: this module is that SQL and those connections. It is a
leaf (the import contract, tests/unit/test_import_contract.py): only tools/dialect.py imports it.

- scenario: the scratch schema (``COMMENT ON SCHEMA`` marks it ours: any other existing schema of
  that name is refused, never dropped), ``search_path`` and ``lock_timeout`` on both sessions, the
  statements sent as written, psycopg's command tag (``cursor.statusmessage``) as the result;
- demo: a slot is a session advisory lock ``(DEMO_LOCK_CLASS, slot)``; the slot's database is
  recreated with ``DROP DATABASE … WITH (FORCE)``; the killed worker's jobs are those of
  ``job_attempts`` and ``job_batches`` naming it, read once its sessions are idle.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import conninfo, sql
from psycopg.pq import TransactionStatus

from ..backend.postgres.connecting import connect, row_of

Error = psycopg.Error
MARKER = "skiplock scenario scratch schema"  # COMMENT ON SCHEMA: we only ever drop schemas carrying it
DEMO_LOCK_CLASS = 0x736B6C  # "skl": the demo slots' advisory lock keys are (DEMO_LOCK_CLASS, slot)
NAME = "PostgreSQL"


# ---- scenario --------------------------------------------------------------------------------

def scenario_connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def scenario_setup(c: psycopg.Connection[Any], schema: str) -> str:
    """Create (or reuse our own) scratch schema with a fresh jobs table; refuse any other existing
    schema of that name. Returns the schema as an SQL identifier, for display."""
    row = c.execute("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
                    (schema,)).fetchone()
    if row is not None and row[0] != MARKER:
        raise psycopg.ProgrammingError(
            f"schema {schema!r} already exists and is not a skiplock scenario scratch schema; choose another name")
    ident = sql.Identifier(schema)
    with c.transaction():
        c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        c.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(ident, sql.Literal(MARKER)))
        c.execute(sql.SQL("DROP TABLE IF EXISTS {}.jobs").format(ident))
        c.execute(sql.SQL("CREATE TABLE {}.jobs (id bigint PRIMARY KEY, task text NOT NULL, "
                          "state text NOT NULL DEFAULT 'queued')").format(ident))
        c.execute(sql.SQL("INSERT INTO {}.jobs (id, task) VALUES (1, 'send welcome email'), "
                          "(2, 'generate invoice')").format(ident))
    return ident.as_string(c)


def scenario_use(c: psycopg.Connection[Any], schema: str, lock_timeout_s: int) -> str:
    """Point the session at the scratch schema, with a lock wait bound; returns the narration line."""
    c.execute("SELECT set_config('search_path', %s, false), set_config('lock_timeout', %s, false)",
              (sql.Identifier(schema).as_string(c), f"{lock_timeout_s}s"))
    return f"search_path set on A and B; lock_timeout = {lock_timeout_s}s on both"


def scenario_execute(c: psycopg.Connection[Any], text: str) -> tuple[str, tuple[str, ...], list[tuple[Any, ...]]]:
    """Send ``text`` as written: (command tag, (), []) or ("", columns, rows)."""
    cur = c.execute(text)  # type: ignore[arg-type]  # seed text, no parameters
    if cur.description is None:
        return cur.statusmessage or "", (), []
    return "", tuple(col.name for col in cur.description), list(cur.fetchall())


def error_text(e: BaseException) -> str:
    """The error, for the step's verdict (its class, its message; a lock wait says so)."""
    diag = getattr(e, "diag", None)
    msg = (diag.message_primary if diag else None) or str(e).strip()
    blocked = isinstance(e, psycopg.errors.LockNotAvailable)
    waited = " (blocked by a row lock the other session holds)" if blocked else ""
    return f"error {type(e).__name__}: {msg}{waited}"


def error_line(e: BaseException) -> str:
    """The error as psql prints it."""
    diag = getattr(e, "diag", None)
    return f"ERROR:  {(diag.message_primary if diag else None) or str(e).strip()}"


def scenario_cleanup(conns: Sequence[psycopg.Connection[Any]], schema: str, drop: bool) -> str | None:
    """Roll back any open transaction, drop the scratch schema if asked, close; a warning or None."""
    warning = None
    for c in conns:
        if not c.closed and c.info.transaction_status != TransactionStatus.IDLE:
            try:
                c.execute("ROLLBACK")
            except psycopg.Error:
                pass
    try:
        if drop and conns and not conns[0].closed:
            conns[0].execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    except psycopg.Error as e:
        warning = f"could not drop scratch schema: {error_text(e)}"
    finally:
        for c in conns:
            c.close()
    return warning


# ---- demo ------------------------------------------------------------------------------------

class Db:
    """An autocommit connection for the demo's own reads."""

    def __init__(self, dsn: str):
        self.conn = connect(dsn, autocommit=True)  # connect: a clear error, without the password

    def one(self, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        return row_of(self.conn.execute(query, params))  # type: ignore[arg-type]

    def all(self, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        return self.conn.execute(query, params).fetchall()  # type: ignore[arg-type]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Db":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def try_slot(lock: Db, slot: int) -> bool:
    """Take demo slot ``slot`` on ``lock``'s session if free (held until the session ends)."""
    return bool(lock.one("SELECT pg_try_advisory_lock(%s, %s)", [DEMO_LOCK_CLASS, slot])[0])


def demo_dsn(admin_dsn: str, database: str) -> str:
    return conninfo.make_conninfo(admin_dsn, dbname=database)


def prepare_database(admin_dsn: str, database: str) -> str:
    """(Re)create ``database`` with the effects table -- the caller holds its slot."""
    with Db(admin_dsn) as c:
        c.conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        c.conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    dsn = demo_dsn(admin_dsn, database)
    with Db(dsn) as c:
        c.conn.execute("CREATE TABLE demo_effects (id bigint GENERATED ALWAYS AS IDENTITY, job_id bigint NOT NULL, "
                       "n int NOT NULL, worker_pid int NOT NULL)")
    return dsn


def has_password(dsn: str) -> bool:
    return bool(conninfo.conninfo_to_dict(dsn).get("password"))


def dsn_hint(database: str) -> str:
    return f"<your DSN with dbname={database}>"


DONE = "SELECT count(*) FROM skiplock.jobs WHERE state = 'done'"


def active_sessions(db: Db, pid: int) -> int:
    """How many of worker process ``pid``'s sessions are running a statement."""
    return int(db.one("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s AND state = 'active'",
                      [f"skiplock-worker %:{pid}/%"])[0])


def jobs_in_flight(db: Db, pid: int) -> list[int]:
    """The jobs worker process ``pid``'s open transactions hold: alone (job_attempts) or in a batch."""
    rows = db.all("SELECT job_id FROM skiplock.job_attempts WHERE worker LIKE %(w)s UNION "
                  "SELECT unnest(ids) FROM skiplock.job_batches WHERE worker LIKE %(w)s", {"w": f"%:{pid}/%"})
    return sorted(int(r[0]) for r in rows)


def report_rows(db: Db, in_flight: list[int], victim_pid: int) -> dict[str, Any]:
    """The figures the demo's table checks."""
    done, failed, other = db.one(
        "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'failed'), "
        "count(*) FILTER (WHERE state NOT IN ('done', 'failed')) FROM skiplock.jobs")
    effects, distinct_jobs = db.one("SELECT count(*), count(DISTINCT job_id) FROM demo_effects")
    doubled = db.one("SELECT count(*) FROM (SELECT job_id FROM demo_effects GROUP BY job_id "
                     "HAVING count(*) > 1) d")[0]
    redone = db.all("SELECT j.id, j.attempts, e.worker_pid FROM skiplock.jobs j JOIN demo_effects e "
                    "ON e.job_id = j.id WHERE j.id = ANY(%s) ORDER BY j.id", [in_flight])
    victims = db.one("SELECT count(*) FROM demo_effects WHERE job_id = ANY(%s) AND worker_pid = %s",
                     [in_flight, victim_pid])[0]
    return {"done": int(done), "failed": int(failed), "other": int(other), "effects": int(effects),
            "distinct_jobs": int(distinct_jobs), "doubled": int(doubled),
            "redone": [tuple(int(v) for v in r) for r in redone], "victim_effects": int(victims)}
