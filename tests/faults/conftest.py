"""Fixtures of the fault-injection suite: its own embedded PostgreSQL (tests stop, restart and partition
it, so it must not be the server the other tests share), a fresh database per test cloned from a
migrated template, worker processes, and the summary table printed at the end of the run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from psycopg import sql

import faults_tasks
from faults_support import SUMMARY, FaultServer, Workers

EFFECTS_DDL = ("CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL, "
               "attempt int NOT NULL, pid int NOT NULL, lease text NOT NULL)")


@pytest.fixture(scope="session")
def fault_server() -> Iterator[FaultServer]:
    """The suite's own server (Unix socket and 127.0.0.1), removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="skiplock-faults-"))
    server = FaultServer(root / "pg")
    try:
        yield server
    finally:
        server.remove()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def fault_template(fault_server: FaultServer) -> str:
    """A migrated database with the ``effects`` table, cloned for every test."""
    name = f"faults_tpl_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fault_server.dsn(), autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    app = faults_tasks.build_app(fault_server.dsn(name))
    app.migrate()
    app.close()
    with psycopg.connect(fault_server.dsn(name), autocommit=True) as c:
        c.execute(EFFECTS_DDL)
    return name


@pytest.fixture
def fault_db_name(fault_server: FaultServer, fault_template: str) -> Iterator[str]:
    fault_server.ensure_running()  # a failed test may have left it stopped
    name = f"faults_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fault_server.dsn(), autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
            sql.Identifier(name), sql.Identifier(fault_template)))
    yield name
    fault_server.ensure_running()
    with psycopg.connect(fault_server.dsn(), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def fdsn(fault_server: FaultServer, fault_db_name: str) -> str:
    """DSN (Unix socket) of this test's fresh database."""
    return fault_server.dsn(fault_db_name)


@pytest.fixture
def fdb(fdsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to this test's database, for set-up and assertions."""
    with psycopg.connect(fdsn, autocommit=True) as c:
        yield c


@pytest.fixture
def producer(fdsn: str) -> Iterator[faults_tasks.FaultsApp]:
    """An in-process App (with the suite's tasks registered) used to enqueue jobs."""
    app = faults_tasks.build_app(fdsn)
    yield app
    app.close()


@pytest.fixture
def exec_dir(tmp_path: Path) -> Path:
    d = tmp_path / "exec"
    d.mkdir()
    return d


@pytest.fixture
def workers(tmp_path: Path, exec_dir: Path) -> Iterator[Workers]:
    w = Workers(tmp_path, exec_dir)
    yield w
    w.cleanup()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The reliability table: one row per scenario run, measured in this run (never constants)."""
    if not SUMMARY:
        return
    tr = terminalreporter
    tr.section("skiplock fault-injection summary")
    headers = ["scenario", "lease", "jobs", "faults injected", "lost", "finished twice", "re-executed",
               "failed (with reason)", "seconds"]
    rows = [[f.scenario, f.mode, str(f.jobs), f.faults, str(f.lost), str(f.finished_twice), str(f.reexecuted),
             str(f.failed), f"{f.seconds:.1f}"] for f in SUMMARY]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 or i == 3 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    tr.write_line(line(headers))
    tr.write_line("  ".join("-" * w for w in widths))
    for r in rows:
        tr.write_line(line(r))
    tr.write_line("lost: jobs missing or not done/failed at the end; finished twice: jobs with more than one "
                  "committed database-local effect;")
    tr.write_line("re-executed: handler runs beyond a job's first (the external, at-least-once view), from the "
                  "workers' execution logs.")
    for f in SUMMARY:
        if f.note:
            tr.write_line(f"note [{f.scenario}, {f.mode}]: {f.note}")
    path = Path(tempfile.gettempdir()) / f"skiplock-faults-summary-{os.getpid()}.json"
    path.write_text(json.dumps([asdict(f) for f in SUMMARY], indent=2))
    tr.write_line(f"(also written as JSON to {path})")
