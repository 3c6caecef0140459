"""The architecture as import contracts (issue #12, item 2), checked on every test run.

ARCHITECTURE.md draws the layers; nothing enforced them, so they leaked. This module
reads every source file's imports with `ast` (no import is executed, no dependency
added) and checks five contracts:

- engine-pure: `dralloc.allocator.engine` imports, directly or through any project
  module it imports, no bus, nats, asyncio, OpenTelemetry or Kubernetes client, and of
  the project only itself and `dralloc.schemas` (the engine is a library: no I/O).
- schemas-independent: `dralloc.schemas` (the contract) imports nothing else of `dralloc`.
- service-isolation: a service package (allocator, discovery, ingestor, statuswriter)
  never imports another's modules; what two services share is a contract in `schemas/`.
- no-private-imports: no module imports a `_`-prefixed name (or module) of another
  package, nor reads one as `module._name` (private means: may change without notice).
- client-via-contracts: the CLI's client code (`dralloc.client`: submit, get, top) talks
  to the services through the bus and `schemas/`, never their modules; it may use the
  engine, a library (ARCHITECTURE.md: the CLI, benchmarks and tests all drive it), through
  the engine package's public face only (`dralloc.allocator.engine`'s names, not its
  modules). `top` evaluates DeviceClass selectors so: which devices a class matches follows
  from the published classes and slices alone, so the client computes it with the engine's
  selector library rather than the allocator publishing it for every reader.
- nats-through-bus: nats-py (`nats`) is imported only by the bus (the `dralloc.bus`
  package), and a bus's own nats-py handles (``.js``, ``.nc``, ``._js``, ``._nc``) are
  touched only inside it: everything else uses `Bus`'s methods. `dralloc.bus.raw` hands
  the handles to tests and benchmarks that meddle with the server on purpose; no other
  `dralloc` module imports it. The tests keep this contract too (nats-py only through
  the bus: `test_tests_reach_nats_only_through_the_bus`).
- no-cycles: no import cycle among dralloc's top-level modules and packages (`dralloc.bus`,
  `dralloc.metrics`, `dralloc.allocator`, ...; the engine counts on its own, a library inside
  the allocator package): a cycle means neither side can be understood, tested or changed
  without the other. Every import edge inside a cycle is reported.

Every import counts, including function-local and `TYPE_CHECKING` ones: a lazy import
is still a dependency. Known violations that cannot be fixed now without colliding
with work in flight are listed in ALLOWED, each with its reason; an entry that no longer
matches a violation fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Source directory -> the import name it is installed as (setup.py's package_dir;
# benchmarks/ is loaded by file path by `dralloc bench` but imports like any client).
ROOTS: dict[str, str] = {"services": "dralloc", "schemas": "dralloc.schemas", "benchmarks": "benchmarks"}

ENGINE = "dralloc.allocator.engine"
SCHEMAS = "dralloc.schemas"
BUS = "dralloc.bus"
CLIENT = "dralloc.client"
SERVICES = ("allocator", "discovery", "ingestor", "statuswriter")
BUS_RAW = "dralloc.bus.raw"
# The attributes a Bus keeps nats-py's connection and JetStream context in (and their public names of old).
BUS_HANDLES = frozenset({"js", "nc", "_js", "_nc"})
# Top-level modules the engine may not reach: I/O, concurrency, transport, clients.
ENGINE_FORBIDDEN = ("asyncio", "nats", "opentelemetry", "kubernetes", "kubernetes_asyncio")


def unit(module: str) -> str | None:
    """The unit an import cycle is counted between: the engine, else dralloc's top-level module or
    package the module is in (None outside dralloc: benchmarks are clients, not layers)."""
    if _within(module, ENGINE):
        return ENGINE
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "dralloc" and len(parts) > 1 else None


def cycles(edges: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node of a directed graph (Tarjan's
    algorithm, iterative): each is a set of nodes that import one another, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(edges.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


@dataclass(frozen=True)
class Import:
    """One imported module (and, for `from M import n`, the name) at a source line."""

    importer: str  # dotted module doing the import
    path: str  # its file, relative to the scanned root
    line: int
    module: str  # dotted module imported (absolute)
    name: str | None  # the name of `from module import name`; None for `import module`


@dataclass(frozen=True)
class Violation:
    """A broken contract: `rule` broken by `importer` importing `target` at `path:line`."""

    rule: str
    importer: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.importer} imports {self.target}"


def module_files(root: Path, roots: Mapping[str, str] = ROOTS) -> dict[str, Path]:
    """Every `.py` file under root's source directories, keyed by its dotted import name."""
    found: dict[str, Path] = {}
    for directory, package in roots.items():
        base = root / directory
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _absolute(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute module of a (possibly relative) `from` import inside `importer`."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def imports_of(module: str, path: Path, root: Path) -> Iterator[Import]:
    """The imports in one file (all of them: top level, in functions, under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    relative = str(path.relative_to(root))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, relative, node.lineno, alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                yield Import(module, relative, node.lineno, target, alias.name)


def private_attribute_reads(module: str, path: Path, root: Path, project: Iterable[str]) -> Iterator[Import]:
    """`alias._name` reads where alias is bound by `import M [as alias]` / `from P import M` to a project module."""
    known = set(project)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    relative = str(path.relative_to(root))
    is_package = path.name == "__init__.py"
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases and _private(node.attr):
            yield Import(module, relative, node.lineno, aliases[node.value.id], node.attr)


def handle_reads(module: str, path: Path, root: Path) -> Iterator[Import]:
    """Every `x.js` / `x.nc` / `x._js` / `x._nc` in a file (a bus's nats-py handles; `nats.js`, the
    package, is an import's business), as an Import of the name from `dralloc.bus.Bus`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    relative = str(path.relative_to(root))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in BUS_HANDLES and not (isinstance(node.value, ast.Name) and node.value.id == "nats"):
            yield Import(module, relative, node.lineno, f"{BUS}.Bus", node.attr)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _package_of(module: str, files: Mapping[str, Path]) -> str:
    """The package a module belongs to: itself for a package (`__init__.py`), else its parent."""
    path = files.get(module)
    if path is not None and path.name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _foreign_private(importer: str, dotted: list[str], files: Mapping[str, Path]) -> str | None:
    """The dotted private name in `dotted` when it belongs to a package other than importer's, else None.

    The first `_`-prefixed part is the private name; it belongs to the package that holds
    it (the part before it when that is a package, else that module's package). Only the
    modules of that same package may use it (not even its subpackages: a parent's private
    helper is no contract for them either).
    """
    at = next((i for i, part in enumerate(dotted) if _private(part)), None)
    if at is None or at == 0:
        return None
    holder = ".".join(dotted[:at])
    owner = _package_of(holder, files) if holder in files else holder
    return None if _package_of(importer, files) == owner else ".".join(dotted[: at + 1])


def _service(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "dralloc" and parts[1] in SERVICES:
        return parts[1]
    return None


def _targets(imp: Import, files: Mapping[str, Path]) -> list[str]:
    """The modules an import depends on: `from P import m` names module P.m when P.m is a file."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in files:
        return [f"{imp.module}.{imp.name}"]
    return [imp.module]


def check(root: Path, roots: Mapping[str, str] = ROOTS) -> list[Violation]:
    """Every contract violation in the tree at root (sorted; empty when the architecture holds)."""
    files = module_files(root, roots)
    imports = [imp for module, path in files.items() for imp in imports_of(module, path, root)]
    found: set[Violation] = set()

    def add(rule: str, imp: Import, target: str) -> None:
        found.add(Violation(rule, imp.importer, target, imp.path, imp.line))

    for imp in imports:
        for target in _targets(imp, files):
            top = target.split(".")[0]
            # schemas-independent
            if _within(imp.importer, SCHEMAS) and _within(target, "dralloc") and not _within(target, SCHEMAS):
                add("schemas-independent", imp, target)
            # service-isolation
            mine, theirs = _service(imp.importer), _service(target)
            if mine and theirs and mine != theirs:
                add("service-isolation", imp, target)
            # client-via-contracts
            if _within(imp.importer, CLIENT) and theirs and target != ENGINE:
                add("client-via-contracts", imp, target)
            # nats-through-bus (the raw handles' module is the bus's escape hatch for tests and benchmarks)
            if top == "nats" and not _within(imp.importer, BUS):
                add("nats-through-bus", imp, target)
            if _within(target, BUS_RAW) and _within(imp.importer, "dralloc") and not _within(imp.importer, BUS):
                add("nats-through-bus", imp, target)
            # engine-pure (direct part; the transitive part follows)
            inside = _within(target, ENGINE) or _within(target, SCHEMAS)
            if _within(imp.importer, ENGINE) and _within(target, "dralloc") and not inside:
                add("engine-pure", imp, target)
        # no-private-imports: a private module or name of another package
        private = _foreign_private(imp.importer, imp.module.split(".") + ([imp.name] if imp.name else []), files)
        if private:
            add("no-private-imports", imp, private)

    for module, path in files.items():
        if not _within(module, BUS):
            for read in handle_reads(module, path, root):
                add("nats-through-bus", read, f"{read.module}.{read.name}")
        for read in private_attribute_reads(module, path, root, files):
            private = _foreign_private(module, [*read.module.split("."), read.name or ""], files)
            if private:
                add("no-private-imports", read, private)

    # engine-pure, transitively: nothing the engine reaches through project modules
    # may import a forbidden top-level module.
    by_importer: dict[str, list[Import]] = {}
    for imp in imports:
        by_importer.setdefault(imp.importer, []).append(imp)
    reached = {m for m in files if _within(m, ENGINE)}
    queue = list(reached)
    while queue:
        for imp in by_importer.get(queue.pop(), []):
            for target in _targets(imp, files):
                if target in files and target not in reached:
                    reached.add(target)
                    queue.append(target)
    for module in reached:
        for imp in by_importer.get(module, []):
            if imp.module.split(".")[0] in ENGINE_FORBIDDEN:
                add("engine-pure", imp, imp.module)

    # no-cycles: every import between two units of one strongly connected component.
    between: dict[str, set[str]] = {}
    crossing: list[tuple[Import, str, str]] = []
    for imp in imports:
        for target in _targets(imp, files):
            here, there = unit(imp.importer), unit(target)
            if here and there and here != there:
                between.setdefault(here, set()).add(there)
                crossing.append((imp, here, there))
    for component in cycles(between):
        for imp, here, there in crossing:
            if here in component and there in component:
                add("no-cycles", imp, there)

    return sorted(found, key=lambda v: (v.path, v.line, v.rule, v.target))


# Known violations: (rule, importer, target) -> why it is not fixed yet. Shrink only.
ALLOWED: dict[tuple[str, str, str], str] = {}


def test_architecture_contracts_hold() -> None:
    """The real tree breaks no contract beyond ALLOWED, and every ALLOWED entry is still needed."""
    violations = check(REPO)
    keys = {(v.rule, v.importer, v.target) for v in violations}
    new = [str(v) for v in violations if (v.rule, v.importer, v.target) not in ALLOWED]
    stale = [key for key in ALLOWED if key not in keys]
    assert not new, "import contracts broken (see tests/test_architecture.py):\n" + "\n".join(new)
    assert not stale, f"ALLOWED entries no longer needed, remove them: {stale}"


def test_tests_reach_nats_only_through_the_bus() -> None:
    """The tests import no nats-py and touch no bus's handles: they use `Bus`'s methods, and
    `dralloc.bus.raw` where they meddle with the server on purpose (a fault test's weakened stream)."""
    found = [str(v) for v in check(REPO, {"tests": "tests"}) if v.rule == "nats-through-bus"]
    assert not found, "tests reaching nats-py past the bus:\n" + "\n".join(found)
    assert "tests.fault.test_gang_commit" in module_files(REPO, {"tests": "tests"})  # (it read the tests)


def test_the_checker_sees_the_real_tree() -> None:
    """A guard against a checker that passes because it read nothing: the engine and the bus are found."""
    files = module_files(REPO)
    assert "dralloc.allocator.engine.engine" in files
    assert "dralloc.schemas.events" in files
    assert any(_within(m, BUS) for m in files)
    engine_imports = {imp.module for imp in imports_of("dralloc.allocator.engine.engine", files["dralloc.allocator.engine.engine"], REPO)}
    assert "dralloc.allocator.engine.inventory" in engine_imports


def test_cycles_finds_each_component_once() -> None:
    """Tarjan's components on a small graph: two cycles, a self-contained chain, a dead end."""
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["f"], "f": ["e", "a"], "g": ["a"]}
    assert sorted(sorted(c) for c in cycles(edges)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": ["b"], "b": ["c"]}) == []


def _tree(root: Path, sources: Mapping[str, str]) -> Path:
    for name, text in sources.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


CLEAN = {
    "services/__init__.py": "",
    "services/bus.py": "import nats\nfrom nats.js.api import StreamConfig\nclass Bus:\n    def info(self):\n        return self._js.stream_info('X')\n",
    "services/allocator/__init__.py": "",
    "services/allocator/service.py": "from dralloc import bus\nfrom dralloc.allocator.engine import Engine\nfrom dralloc.schemas import events\nfrom . import _helpers\n",
    "services/allocator/_helpers.py": "x = 1\n",
    "services/allocator/engine/__init__.py": "from .engine import Engine\n",
    "services/allocator/engine/engine.py": "import re\nfrom dralloc.schemas.resource import Device\nfrom ._bits import _mask\nclass Engine: ...\n",
    "services/allocator/engine/_bits.py": "def _mask(): ...\n",
    "services/client/__init__.py": "",
    "services/client/top.py": "from dralloc.allocator.engine import Engine\nfrom dralloc.bus import Bus\n",
    "services/ingestor/__init__.py": "",
    "services/ingestor/service.py": "import asyncio\nfrom dralloc.schemas.events import GANG_KEY\nfrom dralloc.bus import Bus\n",
    "schemas/__init__.py": "",
    "schemas/events.py": "from dralloc.schemas.resource import Device\nGANG_KEY = 'k'\n",
    "schemas/resource.py": "class Device: ...\n",
}
SYNTHETIC_ROOTS = {"services": "dralloc", "schemas": "dralloc.schemas"}


def test_a_clean_synthetic_tree_passes(tmp_path: Path) -> None:
    """Same-package private names, the bus's own nats, services through schemas: all allowed."""
    assert check(_tree(tmp_path, CLEAN), SYNTHETIC_ROOTS) == []


@pytest.mark.parametrize(
    ("path", "source", "rule", "targets"),
    [
        ("services/allocator/engine/engine.py", "import asyncio\n", "engine-pure", "asyncio"),
        # the bus itself, and (transitively) what the bus imports
        ("services/allocator/engine/engine.py", "from dralloc.bus import Bus\n", "engine-pure", ("dralloc.bus", "nats", "nats.js.api")),
        ("services/allocator/engine/engine.py", "from dralloc import bus\n", "engine-pure", ("dralloc.bus", "nats", "nats.js.api")),
        ("services/allocator/engine/engine.py", "from dralloc.schemas import helper\n", "engine-pure", "opentelemetry"),
        ("schemas/events.py", "from dralloc.allocator.engine import Engine\n", "schemas-independent", "dralloc.allocator.engine"),
        ("schemas/events.py", "from ..allocator import service\n", "schemas-independent", "dralloc.allocator.service"),
        ("services/ingestor/service.py", "from dralloc.allocator.engine.engine import Engine\n", "service-isolation", "dralloc.allocator.engine.engine"),
        ("services/ingestor/service.py", "from ..allocator import service\n", "service-isolation", "dralloc.allocator.service"),
        ("services/ingestor/service.py", "import nats.errors\n", "nats-through-bus", "nats.errors"),
        ("services/bus.py", "from dralloc.allocator.engine.engine import _helper\n", "no-private-imports", "dralloc.allocator.engine.engine._helper"),
        ("services/allocator/service.py", "from dralloc.allocator.engine import _bits\n", "no-private-imports", "dralloc.allocator.engine._bits"),
        ("services/allocator/service.py", "from dralloc.allocator.engine._bits import mask\n", "no-private-imports", "dralloc.allocator.engine._bits"),
        (
            "services/allocator/service.py",
            "from dralloc.allocator.engine import engine\nengine._x()\n",
            "no-private-imports",
            "dralloc.allocator.engine.engine._x",
        ),
        ("services/allocator/service.py", "import dralloc.bus as b\nb._port\n", "no-private-imports", "dralloc.bus._port"),
        # the client code uses the engine through its package's public face, not its modules
        ("services/client/top.py", "from dralloc.allocator.engine.engine import Engine\n", "client-via-contracts", "dralloc.allocator.engine.engine"),
        # a bus's nats-py handles, under any name they had, outside the bus; the raw handles' module
        ("services/ingestor/service.py", "async def f(bus):\n    await bus.js.stream_info('X')\n", "nats-through-bus", "dralloc.bus.Bus.js"),
        ("services/ingestor/service.py", "def f(self):\n    return self.bus._nc.max_payload\n", "nats-through-bus", "dralloc.bus.Bus._nc"),
        ("services/ingestor/service.py", "from dralloc.bus.raw import jetstream\n", "nats-through-bus", "dralloc.bus.raw"),
    ],
)
def test_each_new_violation_is_caught(tmp_path: Path, path: str, source: str, rule: str, targets: str | tuple[str, ...]) -> None:
    """One line added to a clean tree breaks exactly the contract it should (the checker can fail)."""
    sources = dict(CLEAN)
    sources[path] = sources[path] + source
    # schemas/helper.py: a project module the engine reaches that imports OTel (the transitive case).
    sources["schemas/helper.py"] = "from opentelemetry import trace\n"
    violations = check(_tree(tmp_path, sources), SYNTHETIC_ROOTS)
    expected = [(rule, t) for t in ((targets,) if isinstance(targets, str) else targets)]
    # (a layer broken backwards also closes an import cycle: no-cycles has tests of its own)
    assert [(v.rule, v.target) for v in violations if v.rule != "no-cycles"] == expected, violations


def test_an_import_cycle_is_caught(tmp_path: Path) -> None:
    """bus -> telemetry -> metrics -> bus (as it was before #12 item 3): every edge of the cycle is
    reported, a function-local import included; the allocator importing all three is not in it."""
    sources = dict(CLEAN)
    sources["services/bus.py"] += "from dralloc import telemetry\n"
    sources["services/telemetry.py"] = "def setup():\n    from dralloc import metrics\n"
    sources["services/metrics.py"] = "from dralloc.bus import Bus\n"
    sources["services/allocator/service.py"] += "from dralloc import metrics, telemetry\n"
    found = {(v.rule, v.importer, v.target) for v in check(_tree(tmp_path / "before", sources), SYNTHETIC_ROOTS)}
    assert found == {
        ("no-cycles", "dralloc.bus", "dralloc.telemetry"),
        ("no-cycles", "dralloc.telemetry", "dralloc.metrics"),
        ("no-cycles", "dralloc.metrics", "dralloc.bus"),
    }
    sources["services/metrics.py"] = "x = 1\n"  # the lag reporter moved into the bus: no cycle left
    assert check(_tree(tmp_path / "after", sources), SYNTHETIC_ROOTS) == []


def test_the_engine_is_its_own_unit_for_cycles(tmp_path: Path) -> None:
    """metrics reading engine snapshots, the allocator service importing metrics: no cycle, since the
    engine (a library) is not the allocator service; metrics importing the service would be one."""
    sources = dict(CLEAN)
    sources["services/metrics.py"] = "from dralloc.allocator.engine import Engine\n"
    sources["services/allocator/service.py"] += "from dralloc import metrics\n"
    assert check(_tree(tmp_path / "engine", sources), SYNTHETIC_ROOTS) == []
    sources["services/metrics.py"] += "from dralloc.allocator import service\n"
    found = {(v.rule, v.importer, v.target) for v in check(_tree(tmp_path / "service", sources), SYNTHETIC_ROOTS)}
    assert found == {("no-cycles", "dralloc.metrics", "dralloc.allocator"), ("no-cycles", "dralloc.allocator.service", "dralloc.metrics")}
