"""The verifiers' MySQL/MariaDB dialect (``skiplock scenario`` and ``skiplock demo`` on a
``mysql://`` or ``mariadb://`` DSN; tools/dialect.py chooses it). A leaf, as pg_dialect.py: its own
PyMySQL connections and SQL, independent of the backend port it checks.

- scenario: MySQL has no schemas inside a database, so the scratch schema is a scratch *database*
  (``skiplock_scenario`` by default) holding the transcript's ``jobs`` table and a marker table
  (``skiplock_scenario_marker``): an existing database without the marker is refused, never
  dropped. Both sessions ``USE`` it at READ COMMITTED (the claim's isolation) with
  ``innodb_lock_wait_timeout`` as the lock wait bound. The transcript's statements are sent as
  written; MySQL returns no command tag, so the result shown is psql's form of what the server
  reports -- the verb, and for INSERT/UPDATE/DELETE the rows matched (``CLIENT.FOUND_ROWS``, as
  PostgreSQL counts them);
- demo: a slot is a server-wide named lock ``GET_LOCK('skiplock-demo-slot-N', 0)`` held by the slot's
  session; the slot's database is recreated (its stale sessions ended first, as PostgreSQL's
  ``WITH (FORCE)``); the killed worker's jobs are those of the ``skiplock_job_attempts`` rows naming it
  that are in flight (and of its batches, where the schema has them), read once its sessions are idle
  (``COMMAND = 'Sleep'`` in the process list).

Identifiers are back-quoted with embedded back-quotes doubled (MySQL's rule), at most 64 characters;
every value is a bound parameter.
"""

from __future__ import annotations

from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import pymysql
from pymysql.constants import CLIENT

from ..backend.mysql.dsn import connect_args
from ..errors import DatabaseUnavailable, redact, redact_dsn

Error = pymysql.err.MySQLError
MARKER_TABLE = "skiplock_scenario_marker"
NAME = "MySQL/MariaDB"
LOCK_WAIT = (1205, 3572)  # lock wait timeout; NOWAIT's "could not acquire" (MySQL 8)
_IN_TRANSACTION = 1  # SERVER_STATUS_IN_TRANS


def ident(name: str) -> str:
    """``name`` as a MySQL identifier: back-quoted, back-quotes doubled; 1-64 characters, no NUL."""
    if not name or len(name) > 64 or "\x00" in name or name != name.rstrip():
        raise pymysql.err.ProgrammingError(0, f"invalid MySQL database name {name!r}: 1 to 64 characters, "
                                              "no NUL, no trailing space")
    return "`" + name.replace("`", "``") + "`"


def _connect(dsn: str) -> Any:
    args = connect_args(dsn)
    args.setdefault("connect_timeout", 5)
    return pymysql.connect(**args, autocommit=True, charset="utf8mb4", client_flag=CLIENT.FOUND_ROWS)


# ---- scenario --------------------------------------------------------------------------------

def scenario_connect(dsn: str) -> Any:
    return _connect(dsn)


def scenario_setup(c: Any, schema: str) -> str:
    """Create (or reuse our own) scratch database with a fresh jobs table; refuse any other existing
    database of that name. Returns the database as an identifier, for display."""
    quoted = ident(schema)
    with c.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (schema,))
        exists = cur.fetchone()[0]
        cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (schema, MARKER_TABLE))
        if exists and not cur.fetchone()[0]:
            raise pymysql.err.ProgrammingError(
                0, f"database {schema!r} already exists and is not a skiplock scenario scratch database; "
                   "choose another name")
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {quoted}")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {quoted}.{MARKER_TABLE} (created_by VARCHAR(64) NOT NULL)")
        cur.execute(f"DROP TABLE IF EXISTS {quoted}.jobs")
        cur.execute(f"CREATE TABLE {quoted}.jobs (id BIGINT PRIMARY KEY, task TEXT NOT NULL, "
                    "state VARCHAR(16) NOT NULL DEFAULT 'queued') ENGINE=InnoDB")
        cur.execute(f"INSERT INTO {quoted}.jobs (id, task) VALUES (1, 'send welcome email'), "
                    "(2, 'generate invoice')")
    return quoted


def scenario_use(c: Any, schema: str, lock_timeout_s: int) -> str:
    """USE the scratch database at READ COMMITTED with a lock wait bound; returns the narration line."""
    with c.cursor() as cur:
        cur.execute(f"USE {ident(schema)}")
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cur.execute("SET SESSION innodb_lock_wait_timeout = %s", (int(lock_timeout_s),))
    return (f"USE on A and B, READ COMMITTED; innodb_lock_wait_timeout = {lock_timeout_s}s on both "
            "(MySQL has no command tags: a statement's result is shown in psql's form)")


def scenario_execute(c: Any, text: str) -> tuple[str, tuple[str, ...], list[tuple[Any, ...]]]:
    """Send ``text`` as written: (tag, (), []) or ("", columns, rows)."""
    with c.cursor() as cur:
        cur.execute(text)
        if cur.description is None:
            verb = (text.split() or [""])[0].rstrip(";").upper()
            counted = {"UPDATE": "UPDATE {}", "DELETE": "DELETE {}", "INSERT": "INSERT 0 {}"}
            tag = counted[verb].format(cur.rowcount) if verb in counted else verb
            return tag, (), []
        return "", tuple(d[0] for d in cur.description), [tuple(r) for r in cur.fetchall()]


def _parts(e: BaseException) -> tuple[int | None, str]:
    args: tuple[Any, ...] = tuple(getattr(e, "args", ()))
    number = args[0] if args and isinstance(args[0], int) else None
    msg = str(args[1]) if len(args) > 1 else str(e)
    return number, " ".join(msg.split())


def error_text(e: BaseException) -> str:
    number, msg = _parts(e)
    waited = " (blocked by a row lock the other session holds)" if number in LOCK_WAIT else ""
    return f"error {type(e).__name__}: ({number}) {msg}{waited}"


def error_line(e: BaseException) -> str:
    """The error as the mariadb client prints it."""
    number, msg = _parts(e)
    return f"ERROR {number}: {msg}"


def scenario_cleanup(conns: Sequence[Any], schema: str, drop: bool) -> str | None:
    warning = None
    for c in conns:
        if c.open and c.server_status & _IN_TRANSACTION:
            try:
                c.rollback()
            except pymysql.err.Error:
                pass
    try:
        if drop and conns and conns[0].open:
            with conns[0].cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {ident(schema)}")
    except pymysql.err.Error as e:
        warning = f"could not drop scratch database: {error_text(e)}"
    finally:
        for c in conns:
            try:
                c.close()
            except pymysql.err.Error:
                pass
    return warning


# ---- demo ------------------------------------------------------------------------------------

class Db:
    """An autocommit connection for the demo's own reads (a clear error, without the password)."""

    def __init__(self, dsn: str):
        try:
            self.conn = _connect(dsn)
        except pymysql.err.MySQLError as exc:
            number, msg = _parts(exc)
            raise DatabaseUnavailable(f"cannot connect to MySQL at {redact_dsn(dsn)}: ({number}) "
                                      f"{redact(msg, dsn)}") from None

    def one(self, query: str, params: Sequence[Any] = ()) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchone()

    def all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return list(cur.fetchall())

    def execute(self, query: str, params: Sequence[Any] = ()) -> None:
        with self.conn.cursor() as cur:
            cur.execute(query, params)

    def close(self) -> None:
        try:
            self.conn.close()
        except pymysql.err.Error:
            pass

    def __enter__(self) -> "Db":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def try_slot(lock: Db, slot: int) -> bool:
    return lock.one("SELECT GET_LOCK(%s, 0)", (f"skiplock-demo-slot-{slot}",))[0] == 1


def demo_dsn(admin_dsn: str, database: str) -> str:
    parts = urlsplit(admin_dsn.strip())
    return urlunsplit(parts._replace(path="/" + database))


def prepare_database(admin_dsn: str, database: str) -> str:
    """(Re)create ``database`` with the effects table -- the caller holds its slot, so any session
    still in it is a stale one: ended first (DROP DATABASE would wait on its metadata locks)."""
    with Db(admin_dsn) as c:
        for (sid,) in c.all("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s "
                            "AND ID <> CONNECTION_ID()", (database,)):
            try:
                c.execute("KILL CONNECTION %s", (int(sid),))
            except pymysql.err.MySQLError:
                pass  # gone meanwhile
        c.execute(f"DROP DATABASE IF EXISTS {ident(database)}")
        c.execute(f"CREATE DATABASE {ident(database)}")
    dsn = demo_dsn(admin_dsn, database)
    with Db(dsn) as c:
        c.execute("CREATE TABLE demo_effects (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                  "job_id BIGINT NOT NULL, n INT NOT NULL, worker_pid INT NOT NULL, KEY (job_id)) ENGINE=InnoDB")
    return dsn


def has_password(dsn: str) -> bool:
    return bool(urlsplit(dsn.strip()).password)


def dsn_hint(database: str) -> str:
    return f"<your DSN with /{database} as its path>"


DONE = "SELECT COUNT(*) FROM skiplock_jobs WHERE state = 'done'"


def _has_batches(db: Db) -> bool:
    """Whether this schema records batches (``skiplock_job_batches``: a later migration)."""
    return bool(db.one("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                       "AND TABLE_NAME = 'skiplock_job_batches'")[0])


# A job in flight: its attempt row counts an attempt beyond the committed job row's, which is still
# queued (a finished job's attempt row may outlive its commit for a moment; it is not in flight).
_ATTEMPTS_IN_FLIGHT = ("SELECT a.job_id, a.backend_pid FROM skiplock_job_attempts a JOIN skiplock_jobs j "
                       "ON j.id = a.job_id AND j.state = 'queued' AND a.started > j.attempts WHERE a.worker LIKE %s")
# A batch in flight: its row, written before the first handler starts, is deleted by the batch's COMMIT.
_BATCHES_IN_FLIGHT = ("SELECT m.job_id, b.backend_pid FROM skiplock_job_batches b JOIN skiplock_job_batch_jobs m "
                      "ON m.batch_id = b.id WHERE b.worker LIKE %s")


def _in_flight(db: Db, pid: int) -> list[tuple[int, int]]:
    pattern = f"%:{pid}/%"
    rows = db.all(_ATTEMPTS_IN_FLIGHT, (pattern,))
    if _has_batches(db):
        rows += db.all(_BATCHES_IN_FLIGHT, (pattern,))
    return [(int(j), int(s)) for j, s in rows if s is not None]


def active_sessions(db: Db, pid: int) -> int:
    """How many sessions of worker process ``pid`` holding a job are running a statement."""
    sessions = sorted({s for _, s in _in_flight(db, pid)})
    if not sessions:
        return 0
    return int(db.one("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN %s AND COMMAND <> 'Sleep'",
                      (sessions,))[0])


def jobs_in_flight(db: Db, pid: int) -> list[int]:
    """The jobs worker process ``pid``'s open transactions hold: alone (attempts) or in a batch."""
    return sorted({j for j, _ in _in_flight(db, pid)})


def report_rows(db: Db, in_flight: list[int], victim_pid: int) -> dict[str, Any]:
    ids = list(in_flight) or [-1]  # IN () is a syntax error; no job has id -1
    done, failed, other = db.one(
        "SELECT COALESCE(SUM(state = 'done'), 0), COALESCE(SUM(state = 'failed'), 0), "
        "COALESCE(SUM(state NOT IN ('done', 'failed')), 0) FROM skiplock_jobs")
    effects, distinct_jobs = db.one("SELECT COUNT(*), COUNT(DISTINCT job_id) FROM demo_effects")
    doubled = db.one("SELECT COUNT(*) FROM (SELECT job_id FROM demo_effects GROUP BY job_id "
                     "HAVING COUNT(*) > 1) d")[0]
    redone = db.all("SELECT j.id, j.attempts, e.worker_pid FROM skiplock_jobs j JOIN demo_effects e "
                    "ON e.job_id = j.id WHERE j.id IN %s ORDER BY j.id", (ids,))
    victims = db.one("SELECT COUNT(*) FROM demo_effects WHERE job_id IN %s AND worker_pid = %s",
                     (ids, victim_pid))[0]
    return {"done": int(done), "failed": int(failed), "other": int(other), "effects": int(effects),
            "distinct_jobs": int(distinct_jobs), "doubled": int(doubled),
            "redone": [tuple(int(v) for v in r) for r in redone], "victim_effects": int(victims)}
