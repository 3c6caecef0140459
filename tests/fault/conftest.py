"""Fault tests: real processes (nats-server, `dralloc run ...`) killed, stopped and restarted.

The process harness is the pipeline benchmark's (benchmarks/pipeline.py), so the
benchmark and these tests exercise the same stack.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.fixture
def fleet() -> list[dict]:
    """The simulated nodes `bus` publishes (a test module may override it)."""
    return [{"profile": "h100-sxm", "count": 1, "prefix": "n"}]


@pytest.fixture
async def bus(fleet):
    """A private nats-server with the streams, the project's DeviceClasses and the `fleet` (one H100 node)."""
    from pipeline import CLASSES

    from dralloc.bus import Bus, embedded_nats
    from dralloc.discovery.fleet import build_fleet
    from dralloc.ingestor.sources import events_from_manifests
    from dralloc.manifests import load_paths
    from dralloc.schemas import events as ev

    async with embedded_nats() as url, await Bus.connect(url, name="test") as connection:
        await connection.ensure_streams()
        for event in events_from_manifests(load_paths([str(CLASSES)]), print):
            await connection.publish(event)
        for _, slices in build_fleet(fleet):
            for s in slices:
                await connection.publish(ev.ResourceSlicePublished(slice=s))
        yield connection
