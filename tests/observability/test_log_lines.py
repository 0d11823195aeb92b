"""``log_lines`` (observability/logs.py): a claim's line per finished job, written in one go when the
only handler is ``configure_logging``'s ``LineHandler`` -- the same lines, in either format, as one
record each; and the usual path (one record each) whenever anything else could see the records."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from skiplock.observability.logs import (TEXT_FORMAT, JsonFormatter, LineHandler, RedactingFormatter, log_lines)

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO skiplock\.worker: job (\d+) \(fast\) done in "
                       r"\d+\.\d{3}s, attempt 1/5$")


@pytest.fixture
def private_logger(request):
    """A logger of its own (no propagation to pytest's handlers), removed afterwards. pytest attaches
    its capturing handlers to such a logger too: a test sets the logger's handlers it wants."""
    logger = logging.getLogger(f"skiplock.test_log_lines.{request.node.name}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger
    logger.handlers.clear()
    logger.filters.clear()


class CountingStream(io.StringIO):
    """A stream that counts its writes (each one a system call on stderr)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def line_handler(formatter: logging.Formatter) -> tuple[LineHandler, CountingStream]:
    stream = CountingStream()
    handler = LineHandler(stream)
    handler.setFormatter(formatter)
    return handler, stream


MESSAGES = ["job 1 (fast) done in 0.001s, attempt 1/5", "job 2 (fast) 100% done in 0.002s, attempt 1/5",
            "reaching postgresql://me:s3cret-pass-word@db/x", "job 4 (fast) lease lost, attempt 2/5"]


@pytest.mark.parametrize("formatter", [RedactingFormatter(TEXT_FORMAT), JsonFormatter()], ids=["text", "json"])
def test_the_lines_are_those_of_one_record_each(private_logger, formatter):
    handler, stream = line_handler(formatter)
    private_logger.handlers[:] = [handler]
    log_lines(private_logger, logging.INFO, MESSAGES, "finished")
    assert stream.writes == 1  # the one-write path is what is compared here
    together = stream.getvalue().splitlines()
    record = private_logger.makeRecord(private_logger.name, logging.INFO, __file__, 0, "", None, None, "finished")
    one_by_one = []
    for message in MESSAGES:  # the same record and time: what emit writes for each
        record.msg = message
        one_by_one.append(formatter.format(record))
    if isinstance(formatter, JsonFormatter):  # the time is the moment of each call: compare the rest
        together = [{k: v for k, v in json.loads(line).items() if k != "time"} for line in together]
        one_by_one = [{k: v for k, v in json.loads(line).items() if k != "time"} for line in one_by_one]
    else:
        together = [line.split(" ", 2)[2] for line in together]
        one_by_one = [line.split(" ", 2)[2] for line in one_by_one]
    assert together == one_by_one and len(together) == len(MESSAGES)
    assert "s3cret-pass-word" not in stream.getvalue() and "100% done" in stream.getvalue()


def test_a_filter_anywhere_gets_every_record(private_logger):
    handler, stream = line_handler(RedactingFormatter(TEXT_FORMAT))
    private_logger.handlers[:] = [handler]
    seen: list[str] = []

    def keep_odd(record: logging.LogRecord) -> bool:
        seen.append(record.getMessage())
        return record.getMessage().startswith(("job 1 ", "reaching"))

    handler.addFilter(keep_odd)
    log_lines(private_logger, logging.INFO, MESSAGES, "finished")
    assert seen == MESSAGES
    assert len(stream.getvalue().splitlines()) == 2


def test_another_handler_beside_it_gets_every_record_too(private_logger):
    handler, stream = line_handler(RedactingFormatter(TEXT_FORMAT))
    other: list[str] = []  # what the second handler saw

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            other.append(record.getMessage())

    private_logger.handlers[:] = [handler, Collect()]
    log_lines(private_logger, logging.INFO, MESSAGES, "finished")
    assert other == MESSAGES and len(stream.getvalue().splitlines()) == len(MESSAGES)


def test_nothing_below_the_level(private_logger):
    handler, stream = line_handler(RedactingFormatter(TEXT_FORMAT))
    private_logger.handlers[:] = [handler]
    private_logger.setLevel(logging.WARNING)
    log_lines(private_logger, logging.INFO, MESSAGES, "finished")
    assert stream.getvalue() == ""


def test_a_worker_writes_one_line_per_job_of_its_batches(app):
    """The CLI's handler on the worker's logger: every job of every batch gets its line, once."""

    @app.task(name="fast")
    def fast(job):
        return None

    ids = app.enqueue_many([("fast", {}) for _ in range(200)])
    worker_log = logging.getLogger("skiplock.worker")
    handler, stream = line_handler(RedactingFormatter(TEXT_FORMAT))
    saved = (worker_log.handlers[:], worker_log.propagate, worker_log.level)
    worker_log.handlers[:] = [handler]
    worker_log.propagate = False
    worker_log.setLevel(logging.INFO)
    try:
        app.worker(concurrency=2, handle_signals=False).run(stop_when_empty=True)
    finally:
        worker_log.handlers[:], worker_log.propagate, worker_log.level = saved
    done = [TEXT_LINE.match(line) for line in stream.getvalue().splitlines() if " (fast) " in line]
    assert all(done), [line for line in stream.getvalue().splitlines() if not TEXT_LINE.match(line)][:5]
    assert sorted(int(m.group(1)) for m in done) == sorted(ids)
    assert stream.writes < len(ids) / 2  # a write per claim, not per job (batches of up to 32)


def test_one_write_for_a_claims_lines(private_logger):
    """The point of it: a claim's lines reach the stream in one write (one system call on stderr),
    not one write and one flush per job (docs/benchmarks.md, "Session 10")."""
    handler, stream = line_handler(RedactingFormatter(TEXT_FORMAT))
    private_logger.handlers[:] = [handler]
    log_lines(private_logger, logging.INFO, MESSAGES, "finished")
    assert stream.writes == 1 and len(stream.getvalue().splitlines()) == len(MESSAGES)
    private_logger.handlers[:] = [handler, logging.NullHandler()]  # another handler: a record per line
    log_lines(private_logger, logging.INFO, MESSAGES, "finished")
    assert stream.writes == 1 + len(MESSAGES)
