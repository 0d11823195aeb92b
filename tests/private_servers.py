"""What the test set-up's private servers (mariadb_server.py, pg15_server.py, pgbouncer_server.py)
share: the distribution package installed as root when missing, one install at a time across the
test processes (else a skip saying what to install -- which fails the run in CI, see conftest.py), the non-root OS user a server runs as, a
free loopback port, and files and directories only that user can read."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

T = TypeVar("T")


def binary(name: str) -> str | None:
    """``name`` on PATH or in /usr/sbin, /usr/bin (root's PATH may lack sbin)."""
    return shutil.which(name) or next((str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name)
                                       if p.exists()), None)


# apt-get and dpkg allow one installer at a time: the test processes (pytest -n 3) and the servers they
# need install one after the other under this lock, each re-checking once it holds it.
APT_LOCK = Path("/run/lock") / "skiplock-tests-apt.lock"
# How long apt-get itself waits for dpkg's lock held by anything else (an unattended upgrade).
DPKG_LOCK_WAIT = "600"


@contextlib.contextmanager
def installer_lock() -> Iterator[None]:
    """Held while this test process installs a package or adds a user: one at a time across the test
    processes (:data:`APT_LOCK`)."""
    fd = os.open(APT_LOCK if APT_LOCK.parent.is_dir() else Path("/tmp") / APT_LOCK.name,
                 os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def apt_install(package: str, hint: str, present: Callable[[], T | None]) -> T:
    """``present()`` once it is not None: as it is, or after ``apt-get install package`` as root
    (retried after an ``apt-get update``); otherwise skip with ``hint`` (not root) or fail saying what
    apt-get said (root: the install itself failed). Installs are serialised across the test processes
    by :data:`APT_LOCK`. The package may start its system service; the tests never use it (their own
    data dir, socket and port)."""
    found = present()
    if found is not None:
        return found
    if os.geteuid() != 0:
        pytest.skip(hint)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT}", "install", "-y", "-q", package]
    with installer_lock():  # another test process may be installing (this or another package)
        found = present()
        if found is not None:
            return found
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT}", "update", "-q"], env=env,
                           capture_output=True)
            done = subprocess.run(install, env=env, capture_output=True, text=True)
    found = present()
    if found is None:
        pytest.fail(f"{hint}: `{' '.join(install)}` failed: {done.stderr.strip()[-600:]}")
    return found


def server_user(name: str) -> pwd.struct_passwd:
    """The OS user a test server runs as: ``name`` (created if missing) as root, else ourselves."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    # One writer of /etc/passwd at a time, under the installers' lock: seen on a fresh machine, two
    # test processes' useradd (and a package's postinst adding its own user) at once gave one user the
    # other's uid, and the MariaDB bootstrap then found its data directory owned by someone else
    # ("Permission denied").
    with installer_lock():
        try:
            return pwd.getpwnam(name)  # another test process created it meanwhile
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
        return pwd.getpwnam(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_file(path: Path, text: str, user: pwd.struct_passwd) -> None:
    """``text`` in a new 0600 file owned by ``user`` (as root)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if os.geteuid() == 0:
        os.chown(path, user.pw_uid, user.pw_gid)


def private_dir(path: Path, user: pwd.struct_passwd) -> None:
    """A new 0700 directory owned by ``user`` (as root)."""
    path.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(path, user.pw_uid, user.pw_gid)
