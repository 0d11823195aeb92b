"""The import contract of issue 11 (item 1), read from the source with ``ast`` -- nothing is imported.

Enforced now:

1. no import cycle among the modules of ``skiplock.cli``;
2. ``skiplock.backend`` (and its subpackages) never imports the parts above it: ``skiplock.worker``,
   ``skiplock.maintenance``, ``skiplock.outbox``, ``skiplock.app``, ``skiplock.cli``.

A ratchet for the rest of the contract, which the redesign is still removing:

3. the import cycles among all of skiplock's modules (each import edge on a cycle), and the modules above the seam (outside
   ``skiplock.backend``) that import a driver (``psycopg``, ``psycopg_pool``, ``pymysql``) or
   ``skiplock.backend.postgres`` / ``skiplock.backend.mysql``, are listed below as allowlists. A new one fails; so does an
   allowlisted one that no longer occurs, so the lists stay true and only ever shrink.

What counts as an import: every ``import``/``from ... import`` statement in a module, at module
level or inside a function (a deferred import is still a dependency between the layers), naming
the module it imports (``from .x import y`` imports ``x``, or ``x.y`` when that is a module:
``from p import m`` of a submodule imports only ``m``; a package's ``__init__`` is not counted as
imported by importing one of its submodules). An import under
``if TYPE_CHECKING:`` is not an import for the cycles (it never runs), but it is one for rules 2
and the driver ratchet (the layering holds for types too; issue 11 lets the user-facing type of
``job.conn`` be the driver's connection, an entry the lead may keep). ``importlib`` calls with
computed names are not seen.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import deque
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable

PACKAGE = "skiplock"

# --- The ratchet (issue 11). These lists must only shrink: a new entry is a regression of the
# --- redesign, not something to add here. Remove an entry once the redesign removes it (the test
# --- fails until you do, so the lists stay true).

# Import cycles among skiplock's modules (TYPE_CHECKING imports excluded), as the import edges
# (importer, imported) that lie on a cycle. Empty since session 4: the one cycle (app, outbox,
# outbox.writer, worker, worker.loop, worker.executor -- they imported check_text, to_json and
# MAX_QUEUE_CHARS back from app.py) went when those moved to values.py. A new edge on a cycle fails,
# naming the cycle it closes.
ALLOWED_CYCLE_EDGES: set[tuple[str, str]] = set()  # none left: the checks app, worker and outbox share live in values.py

# Today's modules above the seam that import the driver or the PostgreSQL backend, with what each
# imports ("psycopg", "psycopg_pool", or a skiplock.backend.postgres module). "(types)": only under
# TYPE_CHECKING.
ALLOWED_DRIVER_IMPORTS: dict[str, set[str]] = {
    "skiplock.job": {"psycopg"},  # (types): job.conn's type, which issue 11 allows to stay the driver's
}

# Not a ratchet: modules above the seam that are PostgreSQL-specific by design, each with its reason.
# They may import the driver and skiplock.backend.postgres, and they are leaves: no skiplock module
# imports them except those listed with each (test_driver_specific_modules_are_leaves), so the
# driver never reaches the queue's layers through them.
DRIVER_BY_DESIGN: dict[str, tuple[str, tuple[str, ...]]] = {
    "skiplock.dedup": ("an adapter for the receiver's own database, not the queue's: it runs on the user's "
                       "psycopg connection, in the user's transaction, on tables skiplock does not own", ()),
    "skiplock.tools.pg_dialect": ("a verifier's dialect: scenario and demo check the queue's promises with their own "
                                  "SQL on their own PostgreSQL connections, independently of the port they check",
                                  ("skiplock.tools.dialect",)),
    "skiplock.tools.mysql_dialect": ("the same verifiers' MySQL/MariaDB dialect: their own SQL on their own PyMySQL "
                                     "connections", ("skiplock.tools.dialect",)),
    "skiplock.contrib.django.connection": ("Django's psycopg 3 connection, the user's: enqueueing on it and binding "
                                           "it to a handler's lease connection are the driver's objects by nature",
                                           ("skiplock.contrib.django", "skiplock.contrib.django.backend",
                                            "skiplock.contrib.django.runtime",
                                            "skiplock.contrib.django.management.commands.skiplock")),
    "skiplock.contrib.sqlalchemy": ("SQLAlchemy's postgresql+psycopg connections, the user's: enqueueing on their "
                                    "driver connection and giving a Session the lease's are the driver's objects", ()),
}

# Rule 2: what the backend never imports.
ABOVE_THE_BACKEND = ("skiplock.worker", "skiplock.maintenance", "skiplock.outbox", "skiplock.app", "skiplock.cli")
DRIVER = ("psycopg", "psycopg_pool", "pymysql")
POSTGRES_BACKEND = "skiplock.backend.postgres"
MYSQL_BACKEND = "skiplock.backend.mysql"  # the drivers' backends: neither is imported above the seam


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module
    target: str  # the imported module (a skiplock module, or a top-level external name)
    path: Path
    line: int
    text: str  # the import statement as written
    type_checking: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        where = f"{self.path.relative_to(package_root().parent)}:{self.line}"
        note = " (under TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.importer} -> {self.target}: {where} `{self.text}`{note}"


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@cache
def package_root() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations, f"{PACKAGE} is not importable"
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> source file."""
    root = package_root()
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, with whether it sits under ``if TYPE_CHECKING:`` (its else branch
    runs, so it counts as ordinary code)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, type_checking))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(tree, False)
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@cache
def imports() -> tuple[Import, ...]:
    """Every import of every module, resolved to the module imported."""
    known = modules()
    found: list[Import] = []
    for module, path in known.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        is_package = path.name == "__init__.py"
        for node, type_checking in _statements(tree):
            text = " ".join((ast.get_source_segment(source, node) or "").split())
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(module, is_package, node)
                # `from p import m` of a submodule m imports m; a name that is no module is read
                # from p, which is then what is imported.
                submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
                if len(submodules) < len(node.names):
                    targets.append(base)
                targets.extend(submodules)
            for target in dict.fromkeys(targets):
                if not within(target, PACKAGE):
                    target = target.split(".")[0]  # an external package: its top-level name
                found.append(Import(module, target, path, node.lineno, text, type_checking))
    return tuple(found)


def is_cli(module: str) -> bool:
    """The command line's modules: the ``skiplock.cli`` package (and any ``skiplock.cli_*`` module,
    the layout it replaced, which registered commands by being imported)."""
    return within(module, "skiplock.cli") or module.startswith("skiplock.cli_")


def internal_graph(member: Callable[[str], bool] = lambda module: True) -> dict[tuple[str, str], list[Import]]:
    """The runtime import edges (TYPE_CHECKING imports left out) between skiplock's modules for
    which ``member`` holds."""
    known = modules()
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports():
        if imp.type_checking or imp.importer == imp.target or imp.target not in known:
            continue
        if member(imp.importer) and member(imp.target):
            edges.setdefault((imp.importer, imp.target), []).append(imp)
    return edges


def cycles(edges: dict[tuple[str, str], list[Import]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def strongly_connected(edges: dict[tuple[str, str], list[Import]]) -> dict[str, frozenset[str]]:
    """Each module on a cycle -> the modules of its cycle (its strongly connected component)."""
    return {m: c for c in cycles(edges) for m in c}


def cycle_edges(edges: dict[tuple[str, str], list[Import]]) -> set[tuple[str, str]]:
    """The import edges that lie on a cycle: both ends in one strongly connected component."""
    component = strongly_connected(edges)
    return {(a, b) for a, b in edges if a in component and component[a] is component.get(b)}


def describe_cycle(edge: tuple[str, str], edges: dict[tuple[str, str], list[Import]]) -> str:
    """The shortest cycle through ``edge``, each step with its import line."""
    a, b = edge
    previous: dict[str, str] = {}
    queue = deque([b])
    while queue and a not in previous:
        v = queue.popleft()
        for x, y in sorted(edges):
            if x == v and y not in previous and y != b:
                previous[y] = x
                queue.append(y)
    steps = [edge]
    node = a
    while node != b:
        steps.insert(1, (previous[node], node))
        node = previous[node]
    return f"  {a} -> {b} closes the cycle:\n" + "\n".join(f"    {edges[step][0]}" for step in steps)


def test_no_import_cycle_among_the_cli_modules():
    edges = internal_graph(is_cli)
    found = sorted(cycle_edges(edges))
    assert not found, "import cycles among the CLI's modules:\n" + "\n".join(describe_cycle(e, edges) for e in found)


def test_the_backend_never_imports_the_layers_above_it():
    bad = [imp for imp in imports()
           if within(imp.importer, "skiplock.backend") and any(within(imp.target, p) for p in ABOVE_THE_BACKEND)]
    assert not bad, "the backend imports a layer above it:\n" + "\n".join(f"  {imp}" for imp in bad)


def test_import_cycles_only_shrink():
    edges = internal_graph()
    found = cycle_edges(edges)
    new = sorted(found - ALLOWED_CYCLE_EDGES)
    gone = sorted(ALLOWED_CYCLE_EDGES - found)
    message = []
    if new:
        message.append("imports that close a cycle and are not in ALLOWED_CYCLE_EDGES (issue 11 removes import "
                       "cycles, it does not add them):\n" + "\n".join(describe_cycle(e, edges) for e in new))
    if gone:
        message.append("ALLOWED_CYCLE_EDGES lists imports that no longer lie on a cycle (well done); remove them:\n"
                       + "\n".join(f"  {a} -> {b}" for a, b in gone))
    assert not message, "\n".join(message)


def driver_imports() -> dict[str, dict[str, list[Import]]]:
    """Modules above the seam -> what of the driver or the PostgreSQL backend each imports, and where."""
    out: dict[str, dict[str, list[Import]]] = {}
    for imp in imports():
        if within(imp.importer, "skiplock.backend") or imp.importer in DRIVER_BY_DESIGN:
            continue
        if imp.target in DRIVER or within(imp.target, POSTGRES_BACKEND) or within(imp.target, MYSQL_BACKEND):
            out.setdefault(imp.importer, {}).setdefault(imp.target, []).append(imp)
    return out


def test_driver_imports_above_the_seam_only_shrink():
    found = driver_imports()
    new = [imp for module, targets in sorted(found.items()) for target, imps in sorted(targets.items())
           if target not in ALLOWED_DRIVER_IMPORTS.get(module, set()) for imp in imps]
    gone = sorted((module, target) for module, targets in ALLOWED_DRIVER_IMPORTS.items() for target in targets
                  if target not in found.get(module, {}))
    message = []
    if new:
        message.append("new imports of the driver or skiplock.backend.postgres above the seam (issue 11: everything "
                       "above skiplock/backend/ goes through the backend port):\n"
                       + "\n".join(f"  {imp}" for imp in new))
    if gone:
        message.append("ALLOWED_DRIVER_IMPORTS lists imports that no longer occur (well done); remove them:\n"
                       + "\n".join(f"  {module} -> {target}" for module, target in gone))
    assert not message, "\n".join(message)


def test_driver_specific_modules_are_leaves():
    """DRIVER_BY_DESIGN's modules exist, and only the modules listed with each import them."""
    known = modules()
    missing = sorted(m for m in DRIVER_BY_DESIGN if m not in known)
    assert not missing, f"DRIVER_BY_DESIGN lists modules that do not exist: {missing}"
    bad = [imp for imp in imports() if imp.target in DRIVER_BY_DESIGN and imp.importer != imp.target
           and imp.importer not in DRIVER_BY_DESIGN[imp.target][1]]
    assert not bad, ("a driver-specific module (DRIVER_BY_DESIGN) is imported by a skiplock module; the driver "
                     "would reach the layers through it:\n" + "\n".join(f"  {imp}" for imp in bad))


def test_the_analysis_sees_the_imports_it_judges():
    """The rules above pass vacuously if the analysis finds nothing: check it finds known imports."""
    found = {(imp.importer, imp.target, imp.type_checking) for imp in imports()}
    assert ("skiplock.cli", "skiplock.cli.group", False) in found
    assert ("skiplock.cli.jobs", "skiplock.cli.status", False) in found
    assert any(importer == "skiplock.backend.postgres" or within(importer, "skiplock.backend.postgres")
               for importer, target, _ in found if target == "psycopg")
    assert any(tc for _, _, tc in found), "no import under TYPE_CHECKING was seen"
    assert len(modules()) > 30


if __name__ == "__main__":  # pragma: no cover - prints today's lists, to start or check the ratchet
    graph = internal_graph()
    for component in sorted(cycles(graph), key=sorted):
        print(f"# cycle of {len(component)}: {sorted(component)}")
    for edge in sorted(cycle_edges(graph)):
        print(f"    {edge!r},  # " + "; ".join(f"{imp.path.name}:{imp.line}" for imp in graph[edge]))
    for module, targets in sorted(driver_imports().items()):
        print(f"    {module!r}: {set(targets)!r},")


def test_no_two_test_modules_share_a_name():
    """The suite imports test files by basename (no packages under tests/): two files of one name in
    different folders stop the whole run at collection, so the full suite would not start."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(tests.rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(tests)} and {path.relative_to(tests)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test modules sharing a name: " + "; ".join(clashes)
