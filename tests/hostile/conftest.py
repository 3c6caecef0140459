"""Hostile tests: the services as processes under infra/nats/auth.conf, attacked with each credential.

The corpus and the checks are benchmarks/hostile.py's (also behind `dralloc bench
pipeline --hostile`), so the benchmark and these tests send the same attacks.
"""

import sys
from pathlib import Path

import pytest_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def h():
    """One secured stack per module (2 nodes, active + standby allocator, 4 running claims)."""
    import hostile

    async with hostile.harness(nodes=2, allocators=2, running=4) as harness:
        yield harness
