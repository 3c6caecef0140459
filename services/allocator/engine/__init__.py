"""The allocation engine: pure (no I/O, no asyncio)."""
