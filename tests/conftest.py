"""Shared test locations, and the native run (README "Native build").

With DRALLOC_NATIVE=1 the tests run on the native build (the engine's search modules compiled by
mypyc, installed where PYTHONPATH points): the session starts only if each module setup.py
compiles is imported compiled, and tests marked `interpreted` are deselected. Those replace or
instrument the engine's internals (monkeypatch, a subclass, an attribute of another type, a weak reference), which
a compiled module neither sees nor allows; the interpreted run covers them.
"""

import ast
import importlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
NATIVE = os.environ.get("DRALLOC_NATIVE") == "1"


def _native_modules() -> tuple[str, ...]:
    """setup.py's NATIVE_MODULES (read, not imported: importing setup.py runs setup())."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NATIVE_MODULES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no NATIVE_MODULES")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interpreted: replaces or instruments engine internals: deselected on the native build (DRALLOC_NATIVE=1)")
    if NATIVE:
        interpreted = [name for name in _native_modules() if str(importlib.import_module(f"dralloc.allocator.engine.{name}").__file__).endswith(".py")]
        if interpreted:
            raise pytest.UsageError(f"DRALLOC_NATIVE=1 but these engine modules are not compiled: {', '.join(interpreted)} (build: README, Native build)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not NATIVE:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if item.get_closest_marker("interpreted") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: fixtures, examples, the upstream corpus."""
    assert SHARED.is_dir(), f"{SHARED} is missing: the tests read ../shared from the repository root"
    return SHARED


@pytest.fixture
async def nats_url():
    """A private nats-server (real, free port, temp dir, JetStream), stopped and removed afterwards."""
    from dralloc.bus import embedded_nats

    async with embedded_nats() as url:
        yield url


@pytest.fixture
async def bus(nats_url):
    """A connection to the private nats-server, with the dralloc streams created."""
    from dralloc.bus import Bus

    connection = await Bus.connect(nats_url, name="test")
    await connection.ensure_streams()
    try:
        yield connection
    finally:
        await connection.close()
