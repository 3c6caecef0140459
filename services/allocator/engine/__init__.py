"""The allocation engine: pure (no I/O, no asyncio).

`Engine` holds the inventory (classes, nodes, slices) and the ledger of
allocations and answers allocation requests with `Outcome`s.
"""

from dralloc.allocator.engine.engine import Engine, Explanation, Outcome

__all__ = ["Engine", "Explanation", "Outcome"]
