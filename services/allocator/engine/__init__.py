"""The allocation engine: pure (no I/O, no asyncio).

`Engine` holds the inventory (classes, nodes, slices) and the ledger of
allocations and answers allocation requests with `Outcome`s; observers read `Engine.snapshot()`
(an immutable `EngineSnapshot`), never the engine's live state. `compiled()` says whether this is
the native build.

Selectors, as a library: `compile_selector(expression)` compiles a CEL selector (raising
`CelError`) whose ``matches(device_env(driver, device))`` says whether a device matches it (or
raises `CelError` at run time): the engine's own evaluation, for a reader that shows what a
DeviceClass matches from the published classes and slices, without an engine (`dralloc top`;
tests/test_architecture.py lets the CLI's client code use the engine through this package only).
"""

from dralloc.allocator.engine import engine as _engine
from dralloc.allocator.engine.cel import CelError, compile_selector, device_env
from dralloc.allocator.engine.engine import Engine, Outcome
from dralloc.allocator.engine.explanations import Explanation
from dralloc.allocator.engine.snapshot import EngineSnapshot, NodeClassUsage

__all__ = ["CelError", "Engine", "EngineSnapshot", "Explanation", "NodeClassUsage", "Outcome", "compile_selector", "compiled", "device_env"]


def compiled() -> bool:
    """Whether the engine runs compiled (the native build, README "Native build"), not from its sources."""
    return not str(_engine.__file__).endswith(".py")
