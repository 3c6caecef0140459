"""The allocation engine: pure (no I/O, no asyncio).

`Engine` holds the inventory (classes, nodes, slices) and the ledger of
allocations and answers allocation requests with `Outcome`s; observers read `Engine.snapshot()`
(an immutable `EngineSnapshot`), never the engine's live state.
"""

from dralloc.allocator.engine.engine import Engine, Outcome
from dralloc.allocator.engine.explanations import Explanation
from dralloc.allocator.engine.snapshot import EngineSnapshot, NodeClassUsage

__all__ = ["Engine", "EngineSnapshot", "Explanation", "NodeClassUsage", "Outcome"]
