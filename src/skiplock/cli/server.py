"""Database and embedded-server commands of the ``skiplock`` CLI: ``migrate`` and ``server start|stop``."""

from __future__ import annotations

import click

from .group import Context, console, handle_errors


@click.command()
@click.pass_obj
@handle_errors
def migrate(obj: Context) -> None:
    """Install or upgrade the schema (safe to run twice or concurrently)."""
    app = obj.app()
    applied = app.migrate()
    if applied:
        console.print(f"applied migration(s) {', '.join(map(str, applied))} to schema {app.schema!r}", markup=False)
    else:
        console.print(f"schema {app.schema!r} is up to date", markup=False)


@click.group()
def server() -> None:
    """The embedded PostgreSQL server."""


@server.command("start")
@click.option("--tcp/--no-tcp", default=None,
              help="Also listen on 127.0.0.1 (password still required), or stop doing so; kept for later starts. "
                   "[default: as before; a new server: Unix socket only]")
@click.pass_obj
@handle_errors
def server_start(obj: Context, tcp: bool | None) -> None:
    """Start (or reuse) the embedded server and print its DSN (and its TCP DSN with --tcp).

    Only its owner can use it: the DSN names a password file only the owner can read."""
    from ..backend.factory import embedded_server

    s = embedded_server(obj.data_dir, tcp=tcp)
    console.print(s.dsn, markup=False, soft_wrap=True)
    if s.tcp:
        console.print(s.tcp_dsn, markup=False, soft_wrap=True)


@server.command("stop")
@click.pass_obj
@handle_errors
def server_stop(obj: Context) -> None:
    """Stop the embedded server."""
    from ..backend.factory import stop_embedded_server

    console.print("stopped" if stop_embedded_server(obj.data_dir) else "not running", markup=False)
