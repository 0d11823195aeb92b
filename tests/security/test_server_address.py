"""The embedded server keeps its address (issue 10, item 13).

Its port and socket directory are chosen once and kept in the data directory, so after
``skiplock server stop`` and a later start it is where it was, and running workers reconnect on their
own. A kept port that another process has taken meanwhile (only possible with TCP on) is a clear error.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import skiplock
from skiplock.backend.postgres import embedded
from skiplock.errors import ConfigurationError
from support import cli_env, wait_for

HERE = Path(__file__).resolve().parent


def cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skiplock", "--data-dir", str(data), *args], cwd=HERE,
                          env=cli_env(HERE), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("long_path", [False, True], ids=["socket-in-data-dir", "socket-dir-elsewhere"])
def test_stop_and_start_come_back_on_the_same_port_and_socket(servers, long_path):
    data = servers.data_dir(long=long_path)
    first = cli(data, "server", "start")
    assert first.returncode == 0, first.stderr
    before = embedded._read_running(data)
    servers.socket_dirs.add(before.socket_dir)
    assert cli(data, "server", "stop").stdout.strip() == "stopped"
    again = cli(data, "server", "start")
    assert again.returncode == 0, again.stderr
    after = embedded._read_running(data)
    assert (after.port, after.socket_dir) == (before.port, before.socket_dir)
    assert again.stdout == first.stdout  # the same DSN


def test_a_running_worker_carries_on_after_the_server_is_stopped_and_started(servers, tmp_path):
    data = servers.data_dir()
    assert cli(data, "migrate").returncode == 0
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "skiplock", "--data-dir", str(data), "worker", "--app",
                                   "security_tasks:app", "--concurrency", "1", "--poll-interval", "0.05"],
                                  cwd=HERE, env=cli_env(HERE), stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT)
    producer = skiplock.App(data_dir=data)
    try:
        def done(job_id: int) -> bool:
            return producer.get_job(job_id).state == "done"

        first = producer.enqueue("echo", {"n": 1})
        wait_for(lambda: done(first), 60, "the first job", on_timeout=log.read_text)
        producer.close()
        assert cli(data, "server", "stop").stdout.strip() == "stopped"
        assert cli(data, "server", "start").returncode == 0
        second = producer.enqueue("echo", {"n": 2})
        wait_for(lambda: done(second), 90, "the worker to reconnect and run a job", on_timeout=log.read_text)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        producer.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_kept_port_taken_by_another_process_is_a_clear_error(servers, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_EMBEDDED_TCP", "1")
    data = servers.data_dir()
    port = servers.start(data).port
    assert embedded.stop_server(data)
    squatter = socket.create_server(("127.0.0.1", port))
    try:
        with pytest.raises(ConfigurationError, match=f"port {port}.*in use"):
            embedded.ensure_server(data)
        start = cli(data, "server", "start")
        assert start.returncode == 2 and f"port {port}" in start.stderr and "Traceback" not in start.stderr, start
    finally:
        squatter.close()
    assert servers.start(data).port == port
