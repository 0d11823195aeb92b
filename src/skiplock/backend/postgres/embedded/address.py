"""Where the server listens, kept across restarts (the address file), and :class:`EmbeddedServer`, a running server and its DSNs."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from psycopg import conninfo

from ....errors import ConfigurationError
from .config import ADDRESS_FILE, PASSFILE, SUPERUSER, TCP_ENV, TCP_HOST
from .files import _Owner, _bin_dir, _run_as_server_user, _socket_dir_for, _write_private


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

