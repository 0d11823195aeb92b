"""Replays the seed's two-session psql transcript against a real PostgreSQL or MySQL/MariaDB (the same
SQL runs on both) and checks every step; the database-specific part is tools/dialect.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from types import ModuleType

from rich.console import Console

from ..errors import ConfigurationError, SkiplockError, redact
from .dialect import for_dsn

CLAIM_SQL = "SELECT id, task FROM jobs WHERE state = 'queued'\n   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;"
LOCK_TIMEOUT_S = 2  # each session's lock wait bound, in seconds


@dataclass
class StepFailure:
    step: int
    description: str
    expected: str
    got: str


@dataclass
class ScenarioResult:
    ok: bool
    failures: list[StepFailure]
    steps: int


@dataclass(frozen=True)
class Rows:
    """Expected result of a SELECT: column names and rows, in order."""
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class Step:
    session: str           # "A" or "B"
    sql: str               # printed and sent exactly as in the seed
    expect: str | Rows     # command tag (cursor.statusmessage) or rows
    description: str
    note: str = ""         # seed annotation printed after the statement (not sent)
    before: str = ""       # narration printed before the step


JOB1 = Rows(("id", "task"), ((1, "send welcome email"),))
JOB2 = Rows(("id", "task"), ((2, "generate invoice"),))


def seed_steps(claim_sql: str = CLAIM_SQL) -> list[Step]:
    """The seed transcript as data: who sends what, in which order, and what must come back."""
    return [
        Step("A", "BEGIN;", "BEGIN", "A begins"),
        Step("A", claim_sql, JOB1, "A claims the first queued job (job 1)"),
        Step("B", "BEGIN;", "BEGIN", "B begins"),
        Step("B", claim_sql, JOB2, "B claims job 2 without waiting, skipping A's locked job 1",
             note="-- job 1 is claimed \u2014 skipped without waiting" if claim_sql == CLAIM_SQL else ""),
        Step("A", "UPDATE jobs SET state = 'done' WHERE id = 1;", "UPDATE 1", "A marks job 1 done",
             before="A marks job 1 done and commits. B explicitly rolls back; no worker process is killed."),
        Step("A", "COMMIT;", "COMMIT", "A commits"),
        Step("B", "ROLLBACK;", "ROLLBACK", "B rolls back; job 2 stays queued"),
        Step("B", "BEGIN;", "BEGIN", "B begins again",
             before="B selects job 2 again after rollback. This checks row availability, "
                    "not the number of external effects."),
        Step("B", claim_sql, JOB2, "B claims job 2 again after its rollback"),
        Step("B", "UPDATE jobs SET state = 'done' WHERE id = 2;", "UPDATE 1", "B marks job 2 done"),
        Step("B", "COMMIT;", "COMMIT", "B commits"),
        Step("A", "SELECT id, state FROM jobs ORDER BY id;", Rows(("id", "state"), ((1, "done"), (2, "done"))),
             "both jobs are done"),
    ]


def psql_table(columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    """Render rows like psql's aligned format: centred header, numbers right-aligned, (n rows) footer."""
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) for r in rows) for i in range(len(columns))]
    head = [" " * ((w - len(c)) // 2) + c for c, w in zip(columns, widths)]
    lines = ["|".join(f" {h.ljust(w)} " for h, w in zip(head, widths)),
             "+".join("-" * (w + 2) for w in widths)]
    for r in cells:
        lines.append("|".join(f" {v.rjust(w) if num else v.ljust(w)} " for v, w, num in zip(r, widths, numeric)))
    lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return lines


def _show(expect: str | Rows) -> str:
    if isinstance(expect, str):
        return expect
    body = "; ".join(repr(r) for r in expect.rows) or "no rows"
    return f"columns ({', '.join(expect.columns)}): {body}"


def run_scenario(dsn: str, *, schema: str = "skiplock_scenario", out: Console | None = None,
                 keep: bool = False, claim_sql: str | None = None) -> ScenarioResult:
    """Replay the seed transcript on two connections (sessions A and B) and check every step.

    Demonstrated: at READ COMMITTED, B's ``FOR UPDATE SKIP LOCKED`` claim skips the row A holds
    (B has a lock wait bound -- PostgreSQL's ``lock_timeout``, MySQL's ``innodb_lock_wait_timeout``
    -- so a wait becomes an error, not a hang), the completion UPDATEs commit, and an explicit
    ROLLBACK makes B's selected job available again.  Not demonstrated: no worker process is
    killed, no task (email, invoice) is executed, nothing about duplicate-free external effects or
    FIFO fairness.  Runs in a scratch schema (on MySQL/MariaDB a scratch database; created, then
    dropped unless ``keep``), through the DSN's dialect (tools/dialect.py: PostgreSQL, or
    MySQL/MariaDB where the same SQL runs); ``claim_sql`` replaces the claim statement so tests
    can inject a deviation.
    """
    out = out or Console()

    def say(line: str = "", style: str | None = None) -> None:
        out.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True, style=style)

    try:
        dialect = for_dsn(dsn)
    except ConfigurationError as e:
        return _verdict(say, [StepFailure(0, "setup: choose the database's dialect", "success", str(e))], 0)
    steps = seed_steps(claim_sql or CLAIM_SQL)
    failures: list[StepFailure] = []
    conns: dict[str, Any] = {}
    done, owned = 0, False
    try:
        try:
            for name in ("A", "B"):
                conns[name] = dialect.scenario_connect(dsn)
            shown = dialect.scenario_setup(conns["A"], schema)
            owned = True
            for c in conns.values():
                narration = dialect.scenario_use(c, schema, LOCK_TIMEOUT_S)
        except (dialect.Error, SkiplockError) as e:
            failures.append(StepFailure(0, "setup: connect and create the scratch schema", "success",
                                        redact(_error(dialect, e), dsn)))  # the driver may quote the DSN
            return _verdict(say, failures, 0)
        say(f"-- setup (not part of the walk-through): schema {shown}, table jobs with rows "
            f"(1, 'send welcome email'), (2, 'generate invoice'), state 'queued';", style="dim")
        say(f"-- {narration}, so a lock wait fails instead of hanging.", style="dim")
        say()
        say("Two workers select available queued rows in id order and mark database state done. "
            "Task names are data; no email or invoice is executed.")
        for number, step in enumerate(steps, start=1):
            if step.before:
                say()
                say(step.before)
            say()
            _echo(say, step)
            got, ok = _run_step(say, dialect, conns[step.session], step)
            done = number
            if not ok:
                failures.append(StepFailure(number, step.description, _show(step.expect), got))
                say(f"   ^ step {number} did not return what the walk-through expects: expected {_show(step.expect)}, got {got}",
                    style="bold red")
        return _verdict(say, failures, done)
    finally:
        warning = dialect.scenario_cleanup(list(conns.values()), schema, drop=owned and not keep)
        if warning:
            say(f"warning: {warning}", style="yellow")


def _error(dialect: ModuleType, e: BaseException) -> str:
    return str(e) if isinstance(e, SkiplockError) else dialect.error_text(e)


def _echo(say: Any, step: Step) -> None:
    lines = step.sql.strip().splitlines() or [""]
    printed = [f"{step.session}> {lines[0]}"] + [f"   {ln.strip()}" for ln in lines[1:]]
    if step.note:
        printed[-1] += f" {step.note}"
    for ln in printed:
        say(ln)


def _run_step(say: Any, dialect: ModuleType, conn: Any, step: Step) -> tuple[str, bool]:
    """Send the statement; print its psql-like result; return (what came back, whether it matched)."""
    try:
        tag, columns, rows = dialect.scenario_execute(conn, step.sql)
    except dialect.Error as e:
        say(dialect.error_line(e))
        return dialect.error_text(e), False
    if not columns:
        say(tag)
        return tag, tag == step.expect
    got = Rows(columns, tuple(rows))
    for ln in psql_table(got.columns, list(got.rows)):
        say(ln)
    return _show(got), got == step.expect


def _verdict(say: Any, failures: list[StepFailure], steps: int) -> ScenarioResult:
    say()
    if not failures:
        say("scenario OK: every step returned what the walk-through expects", style="bold green")
        return ScenarioResult(True, [], steps)
    f = failures[0]
    more = f" (and {len(failures) - 1} more differing step(s))" if len(failures) > 1 else ""
    say(f"scenario FAILED at step {f.step}: {f.description}: expected {f.expected}, got {f.got}{more}",
        style="bold red")
    return ScenarioResult(False, failures, steps)
