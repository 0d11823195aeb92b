"""The ``skiplock`` group and what every command shares: the global options (:class:`Context`),
the consoles, one-line errors with their exit codes (:func:`fail`, :func:`handle_errors`), loading
``--app``/``--sink`` objects (:func:`import_object`) and JSON options.

The group holds no command of its own: :mod:`skiplock.cli` adds each family's commands to it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import sys
from typing import Any, Callable, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ..app import App
from ..errors import DatabaseUnavailable, SchemaError, SkiplockError

err_console = Console(stderr=True, highlight=False)
console = Console(highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    sys.exit(code)


def plain(value: object) -> Text:
    """Data (a schema, queue or task name, an error, JSON) for a rich table: shown as it is, never
    read as markup (a name like ``[/bold]`` would otherwise break the output)."""
    return Text(str(value))


class Context:
    def __init__(self, dsn: str | None, data_dir: str | None, schema: str | None, quiet: bool):
        self.dsn, self.data_dir, self.schema, self.quiet = dsn, data_dir, schema, quiet

    def app(self, spec: str | None = None) -> App:
        """The user's App (``module:attr``) or a plain one, configured from the global options."""
        app = load_app(spec) if spec else App()
        app.configure(dsn=self.dsn, data_dir=self.data_dir, schema=self.schema)
        self.announce(app)
        return app

    def announce(self, app: App) -> None:
        _ = app.dsn  # resolves the DSN, starting the embedded server if needed
        server = app.embedded_server
        if server is not None and not self.quiet:
            tcp = f", TCP 127.0.0.1:{server.port}" if server.tcp else ""
            err_console.print(f"skiplock: embedded PostgreSQL in {server.data_dir} (socket {server.socket_dir}, "
                              f"port {server.port}{tcp})", markup=False, soft_wrap=True)


def search_current_directory_for(module_name: str) -> None:
    """Make ``module_name`` importable from the current directory when nothing on ``sys.path`` has
    it. The directory goes *last* on the path, so it only ever adds names: a file there
    (``json.py``, ``click.py``) never shadows a standard or installed module, for the ``--app``
    module's own imports or for anything imported later."""
    top = module_name.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    cwd = os.getcwd()
    if not found and cwd not in sys.path:
        sys.path.append(cwd)


def import_object(spec: str, option: str) -> Any:
    """``package.module:attr`` (attr may be dotted) -> the object, or a clear error naming ``option``.
    A module found nowhere else is looked for in the current directory (after every other entry of
    ``sys.path``: :func:`search_current_directory_for`)."""
    if ":" not in spec:
        fail(f"{option} must look like 'package.module:attr', got {spec!r}")
    module_name, attr = spec.split(":", 1)
    if not all(part.isidentifier() for part in module_name.split(".")):
        fail(f"{option} must look like 'package.module:attr', got {spec!r}")
    search_current_directory_for(module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import {module_name!r} for {option}: {exc}")
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    return obj


APP_SEARCH = ("The module is imported from the installed packages and PYTHONPATH; if none has it, from the "
              "current directory, searched last (it never shadows an installed module).")


def load_app(spec: str) -> App:
    obj = import_object(spec, "--app")
    if not isinstance(obj, App):
        fail(f"{spec!r} is not a skiplock.App (found {type(obj).__name__})")
    return obj


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User mistakes and unreachable databases become one clear line, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (DatabaseUnavailable, SchemaError) as exc:
            fail(str(exc), 3)
        except SkiplockError as exc:
            fail(str(exc), 2)
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--dsn", envvar="SKIPLOCK_DSN",
              help="PostgreSQL DSN. Default: the embedded server. A DSN with a password is better given as "
                   "SKIPLOCK_DSN: other local users can read a command line. Never shown with its password.")
@click.option("--data-dir", envvar="SKIPLOCK_DATA_DIR", type=click.Path(file_okay=False),
              help="Embedded server data directory (when no DSN is given).")
@click.option("--schema", envvar="SKIPLOCK_SCHEMA", help="Database schema holding skiplock's tables [skiplock].")
@click.option("-q", "--quiet", is_flag=True, help="Do not announce the embedded server.")
@click.option("--log-format", type=click.Choice(["text", "json"]), envvar="SKIPLOCK_LOG_FORMAT", default="text",
              show_default=True, help="Log lines of worker and relay: text, or one JSON object per line.")
@click.version_option(package_name="skiplock")
@click.pass_context
def cli(ctx: click.Context, dsn: str | None, data_dir: str | None, schema: str | None, quiet: bool,
        log_format: str) -> None:
    """skiplock: a PostgreSQL job queue on FOR UPDATE SKIP LOCKED; the transaction is the lease."""
    from ..observability import logs

    logs.default_format = log_format
    ctx.obj = Context(dsn, data_dir, schema, quiet)


def json_option(option: str, text: str) -> Any:
    """The value of a JSON command-line option, or a clear one-line error (exit 2)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not valid JSON: {exc}")
    except RecursionError:
        fail(f"{option} is nested too deeply")


# The colour of each job state in tables (``status``, ``jobs``, ``queues``).
STATE_STYLE = {"queued": "cyan", "running": "yellow", "done": "green", "failed": "red", "cancelled": "magenta"}
