"""The ``skiplock`` group and what every command shares: the global options (:class:`Context`),
the consoles, one-line errors with their exit codes (:func:`fail`, :func:`handle_errors`), loading
``--app``/``--sink`` objects (:func:`import_object`) and JSON options.

The group holds no command of its own: :mod:`skiplock.cli` adds each family's commands to it.

Start-up cost: this module imports neither :mod:`skiplock.app` (and so not the database driver) nor
rich until a command needs them (``skiplock --help`` needs neither; ``bench/cli_import.py``
measures it). Usage errors (a bad option value, an unknown option) are one line on stderr, exit 2
(:class:`SkiplockGroup`). The global options are also accepted after the command
(:func:`accept_global_options`): ``skiplock status --dsn ...`` is ``skiplock --dsn ... status``.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import json
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import click

from ..errors import DatabaseUnavailable, SchemaError, SkiplockError

if TYPE_CHECKING:
    from rich.text import Text

    from ..app import App


class LazyConsole:
    """A rich ``Console`` made on first use (rich costs tens of milliseconds to import).

    Standard output that is not a terminal (a pipe, a file) gets a very wide console, so tables are
    never truncated or wrapped there: ids, timestamps and names stay whole for ``grep``/``awk``."""

    def __init__(self, stderr: bool):
        self._stderr = stderr
        self._console: Any = None

    @property
    def real(self) -> Any:
        """The rich Console itself (for rich objects that take one: Progress, Live)."""
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            wide = None if stream.isatty() else 100_000
            self._console = Console(stderr=self._stderr, highlight=False, width=wide)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


err_console: Any = LazyConsole(stderr=True)
console: Any = LazyConsole(stderr=False)


def fail(message: str, code: int = 2) -> NoReturn:
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    sys.exit(code)


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    from rich.markup import escape

    err_console.print(f"[bold yellow]warning:[/] {escape(message)}", markup=True, soft_wrap=True)


def plain(value: object) -> Text:
    """Data (a schema, queue or task name, an error, JSON) for a rich table: shown as it is, never
    read as markup (a name like ``[/bold]`` would otherwise break the output)."""
    from rich.text import Text

    return Text(str(value))


class Context:
    def __init__(self, dsn: str | None, data_dir: str | None, schema: str | None, quiet: bool):
        self.dsn, self.data_dir, self.schema, self.quiet = dsn, data_dir, schema, quiet

    def app(self, spec: str | None = None) -> App:
        """The user's App (``module:attr``; an AsyncApp's App) or a plain one, configured from the
        global options."""
        from ..app import App

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
    ``sys.path``: :func:`search_current_directory_for`).

    A module that is not found is one line; a module that fails while it is imported (a syntax
    error, an exception, a missing dependency of its own) is one paragraph ending with the user's
    own traceback, without the frames of importlib and skiplock; an attribute that does not exist
    says what the module does contain (and the closest name)."""
    if ":" not in spec:
        fail(f"{option} must look like 'package.module:attr', got {spec!r}")
    module_name, attr = spec.split(":", 1)
    if not all(part.isidentifier() for part in module_name.split(".")) or not all(
            part.isidentifier() for part in attr.split(".")):
        fail(f"{option} must look like 'package.module:attr', got {spec!r}")
    search_current_directory_for(module_name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            fail(f"cannot import {module_name!r} for {option}: {exc} (looked in the installed packages, "
                 "PYTHONPATH and the current directory)")
        _import_failed(module_name, option, exc)
    except Exception as exc:  # the user's module raised while it was imported
        _import_failed(module_name, option, exc)
    obj: Any = module
    where = module_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            fail(f"{where!r} has no attribute {part!r} (for {option} {spec}); {_contents(obj, part)}")
        obj = getattr(obj, part)
        where = f"{where}.{part}"
    return obj


def _import_failed(module_name: str, option: str, exc: BaseException) -> NoReturn:
    """The user's module raised while imported: say so in one paragraph, then their traceback (the
    frames of their own files only), exit 2."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _internal(f.filename)]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] importing {escape(repr(module_name))} for {option} failed: "
                      f"{escape(type(exc).__name__)} in your module (its traceback follows; skiplock's and "
                      "Python's import machinery's frames left out).", markup=True, soft_wrap=True)
    err_console.print("Traceback (most recent call last):\n" + "".join(lines).rstrip(), markup=False,
                      soft_wrap=True, highlight=False)
    sys.exit(2)


_SKIPLOCK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _internal(filename: str) -> bool:
    return (filename.startswith("<frozen importlib") or os.path.abspath(filename).startswith(_SKIPLOCK_DIR + os.sep)
            or any(f"{os.sep}{name}{os.sep}" in filename for name in ("importlib", "click")))


def _contents(obj: Any, missing: str) -> str:
    """What ``obj`` (a module or object) does contain, for an attribute typo: its skiplock apps
    first, then its other public names, and the closest match to ``missing``."""
    app_types = _app_types()
    names = [n for n in dir(obj) if not n.startswith("_")]
    apps = [n for n in names if isinstance(getattr(obj, n, None), app_types)]
    close = difflib.get_close_matches(missing, apps, n=1) or difflib.get_close_matches(missing, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if apps:
        return hint + "its skiplock apps: " + ", ".join(f"{n} ({type(getattr(obj, n)).__name__})" for n in apps)
    shown = names[:20]
    return hint + ("it has no skiplock App; its names: " + ", ".join(shown) + (" ..." if len(names) > 20 else "")
                   if shown else "it defines no public name")


def _app_types() -> tuple[type, ...]:
    from ..app import App

    aio = sys.modules.get("skiplock.aio")
    return (App, aio.AsyncApp) if aio is not None else (App,)


APP_SEARCH = ("The module is imported from the installed packages and PYTHONPATH; if none has it, from the "
              "current directory, searched last (it never shadows an installed module).")


def load_app(spec: str) -> App:
    """``module:attr`` naming a :class:`~skiplock.App` or an :class:`~skiplock.AsyncApp` (its App is
    used: the same tasks, the same settings)."""
    from ..app import App

    obj = import_object(spec, "--app")
    aio = sys.modules.get("skiplock.aio")  # imported if the module made an AsyncApp: no cost otherwise
    if aio is not None and isinstance(obj, aio.AsyncApp):
        obj = obj.app
    if not isinstance(obj, App):
        fail(f"{spec!r} is not a skiplock.App or AsyncApp (found {type(obj).__name__})")
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
        except NotImplementedError as exc:  # a verb this database's backend does not have
            fail(f"not supported on this database: {exc}", 2)
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


class SkiplockGroup(click.Group):
    """The root group: a usage error (an unknown option, a bad value, a missing argument) is one line
    on stderr -- ``error: <what> (see 'skiplock CMD --help')`` -- and exit 2, like every other bad
    input; every command added takes the global options after its name (:func:`accept_global_options`)."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        accept_global_options(cmd)  # every command takes the global options after its name too
        super().add_command(cmd, name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("standalone_mode", True):
            return super().main(*args, **kwargs)
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "skiplock"
            fail(f"{exc.format_message()} (see '{where} --help')", exc.exit_code)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.exceptions.Abort:
            fail("aborted", 1)
        sys.exit(code if isinstance(code, int) else 0)


# The global options, by name: (the Context attribute it sets, the click option's declarations, help).
_GLOBAL_OPTIONS: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (
    ("dsn", ("--dsn",), {}),
    ("data_dir", ("--data-dir",), {"type": click.Path(file_okay=False)}),
    ("schema", ("--schema",), {}),
    ("quiet", ("-q", "--quiet"), {"is_flag": True, "default": None}),
    ("log_format", ("--log-format",), {"type": click.Choice(["text", "json"])}),
)


def _set_global(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None and attr == "log_format":  # not the Context's: the log lines' format
            from ..observability import logs

            logs.default_format = value
            return
        obj = ctx.find_object(Context)
        if value is not None and obj is not None:
            setattr(obj, attr, value)
    return callback


def accept_global_options(command: click.Command) -> click.Command:
    """Let ``command`` (and every subcommand of a group) take the global options after its name, as
    well as before: ``skiplock jobs --dsn X`` is ``skiplock --dsn X jobs``. Given in both places, the
    later one wins. They are hidden in the command's help (the group's help lists them)."""
    taken = {opt for p in command.params for opt in getattr(p, "opts", [])}
    for attr, decls, extra in _GLOBAL_OPTIONS:
        if not taken.intersection(decls):
            command.params.append(click.Option(decls, hidden=True, expose_value=False, callback=_set_global(attr),
                                               **extra))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            accept_global_options(sub)
    return command


@click.group(cls=SkiplockGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
    """skiplock: a job queue on PostgreSQL. A worker claims a job, runs your handler and marks the job
    done in one transaction: if anything fails before COMMIT, the job is simply available again.

    The global options (--dsn, --data-dir, --schema, -q, --log-format) may also follow the command. Durations
    (--delay, --timeout, prune's ages, ...) are 30s, 5m, 1h, 1d, 2w or plain seconds. Commands that
    print data take --json: one JSON document on stdout."""
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


def json_flag(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--json`` option: the command prints one JSON document on stdout instead of tables."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout instead of tables.")(fn)


def emit_json(document: Any) -> None:
    """Print ``document`` as one JSON document (times ISO 8601 UTC, durations in seconds), then exit
    the command normally. Written straight to stdout: never wrapped, never styled."""
    from .formatting import to_jsonable

    sys.stdout.write(json.dumps(to_jsonable(document), ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


# The colour of each job state in tables (``status``, ``jobs``, ``queues``).
STATE_STYLE = {"queued": "cyan", "running": "yellow", "done": "green", "failed": "red", "cancelled": "magenta",
               "blocked": "blue"}
