"""The allocator's metrics, read with an in-memory reader while the services run on a real nats-server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from dralloc import demo
from dralloc.bus import Bus, embedded_nats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from pipeline import CLASSES, claim_event  # noqa: E402

ONE_NODE = [{"profile": "h100-sxm", "count": 1, "prefix": "h100"}]  # 8 GPUs


@pytest.fixture(scope="module")
def reader() -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # once per process, as the SDK allows
    return reader


def points(reader: InMemoryMetricReader) -> dict[str, list]:
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


async def test_decisions_latency_devices_and_lag_are_reported(reader, tmp_path):
    (tmp_path / "classes.yaml").write_text(CLASSES.read_text())
    async with embedded_nats() as url, await Bus.connect(url, name="test") as bus:
        await bus.ensure_streams()
        async with demo.running(url, paths=[str(tmp_path)], fleet=ONE_NODE, services=("discovery", "ingestor", "allocator")):
            await bus.publish(claim_event("four", gpus=4))
            await bus.publish(claim_event("too-many", gpus=8))  # 4 left: unsatisfiable
            async with asyncio.timeout(20):
                while True:
                    found = points(reader)
                    outcomes = {p.attributes["outcome"]: p.value for p in found.get("dralloc.claims", [])}
                    if outcomes.get("committed") == 1 and outcomes.get("unsatisfiable") and "dralloc.consumer.lag" in found:
                        break
                    await asyncio.sleep(0.2)

    durations = {p.attributes["outcome"]: p for p in found["dralloc.allocation.duration"]}
    assert durations["committed"].count == 1 and 0 < durations["committed"].sum < 5
    held = {(p.attributes["node"], p.attributes["device_class"]): p.value for p in found["dralloc.devices.allocated"]}
    assert held == {("h100-0", "gpu.nvidia.com"): 4}
    lag = {(p.attributes["stream"], p.attributes["consumer"]): p.value for p in found["dralloc.consumer.lag"]}
    assert ("CLAIMS", "allocator") in lag and lag[("CLAIMS", "allocator")] >= 0
