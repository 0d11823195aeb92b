"""No world-writable, predictable paths (issue 10, item 2).

A data directory whose path is too long for a Unix socket gets its socket in a separate directory.
That directory is private (0700, the server user's), its name is not derived from anything another
user can know, and whatever another user plants at its path -- a symlink, a directory of their own --
is refused, never followed or chmod-ed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from skiplock.backend.postgres import embedded
from skiplock.errors import ConfigurationError
from security_support import as_user, old_predictable_socket_dir


@pytest.fixture
def bait(intruder) -> Path:
    """A directory of the intruder's, where they would like our socket (or our chmod) to land."""
    d = Path(tempfile.mkdtemp(prefix="skl-bait-"))
    shutil.chown(d, intruder, intruder)
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def assert_untouched(bait: Path) -> None:
    assert stat.S_IMODE(os.lstat(bait).st_mode) == 0o755
    assert list(bait.iterdir()) == []


def test_the_socket_dir_is_private_and_another_user_cannot_swap_the_socket(servers, intruder):
    server = servers.start(servers.data_dir(long=True))
    assert server.socket_dir.parent == Path("/tmp") and server.socket_dir != server.data_dir
    st = os.lstat(server.socket_dir)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.stat(server.data_dir).st_uid
    sock = server.socket_dir / f".s.PGSQL.{server.port}"
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    for argv in (["touch", str(server.socket_dir / "planted")],  # a file of theirs next to ours
                 ["rm", "-f", str(sock)],  # the swap: remove ours ...
                 ["ln", "-sf", "/tmp/theirs", str(sock)]):  # ... and put theirs in its place
        attempt = as_user(intruder, argv)
        assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, (argv, attempt)
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    assert sorted(p.name for p in server.socket_dir.iterdir()) == sorted([sock.name, sock.name + ".lock"])


def test_the_old_predictable_path_is_not_used(servers, intruder, bait):
    data = servers.data_dir(long=True)
    planted = old_predictable_socket_dir(data)
    assert as_user(intruder, ["ln", "-s", str(bait), str(planted)]).returncode == 0
    try:
        server = servers.start(data)
        assert server.socket_dir != planted
        assert_untouched(bait)
    finally:
        planted.unlink()


def test_a_symlink_planted_at_the_socket_dir_path_is_refused(servers, intruder, bait):
    """The socket dir's name is kept in the data dir; if it vanished (a /tmp cleaner) and another
    user planted a symlink at its path, the next start refuses it instead of following it."""
    data = servers.data_dir(long=True)
    server = servers.start(data)
    assert embedded.stop_server(data)
    shutil.rmtree(server.socket_dir)
    assert as_user(intruder, ["ln", "-s", str(bait), str(server.socket_dir)]).returncode == 0
    try:
        with pytest.raises(ConfigurationError, match="symlink"):
            embedded.ensure_server(data)
        assert_untouched(bait)
        assert embedded._read_running(data) is None
    finally:
        server.socket_dir.unlink()


def test_a_directory_of_another_user_at_the_socket_dir_path_is_refused(servers, intruder):
    data = servers.data_dir(long=True)
    server = servers.start(data)
    assert embedded.stop_server(data)
    shutil.rmtree(server.socket_dir)
    assert as_user(intruder, ["mkdir", "-m", "0777", str(server.socket_dir)]).returncode == 0
    try:
        with pytest.raises(ConfigurationError, match="owned by"):
            embedded.ensure_server(data)
        assert stat.S_IMODE(os.lstat(server.socket_dir).st_mode) == 0o777  # not chmod-ed either
        assert list(server.socket_dir.iterdir()) == []
    finally:
        server.socket_dir.rmdir()


def test_a_vanished_socket_dir_is_recreated_private(servers):
    data = servers.data_dir(long=True)
    server = servers.start(data)
    assert embedded.stop_server(data)
    shutil.rmtree(server.socket_dir)
    again = servers.start(data)
    assert (again.socket_dir, again.port) == (server.socket_dir, server.port)
    assert stat.S_IMODE(os.lstat(again.socket_dir).st_mode) == 0o700
