"""The tasks the MariaDB CLI acceptance test (test_mysql_cli.py) runs through ``skiplock worker --app``."""

from __future__ import annotations

from typing import Any

import skiplock

app = skiplock.App()


@app.task(name="mycli.add")
def add(job: Any, a: int, b: int) -> int:
    with job.conn.cursor() as cur:  # a DB-API cursor, %s placeholders: psycopg's and PyMySQL's alike
        cur.execute("INSERT INTO cli_effects (job_id, total) VALUES (%s, %s)", (job.id, a + b))
    return a + b


@app.task(name="mycli.fail", max_attempts=1)
def fail(job: Any) -> None:
    raise ValueError("this task always fails")
