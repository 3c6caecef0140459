"""One in-memory metric reader for the whole session (the SDK takes one meter provider per process)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

Readings = dict[str, dict[tuple, Any]]
"""Metric name -> (attribute values, sorted by attribute name) -> the point's value (the point, for histograms)."""


@pytest.fixture(scope="session")
def reader() -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def read(reader: InMemoryMetricReader) -> Readings:
    """Collect now (the gauges' callbacks run) and index the points."""
    found: Readings = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = found.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    key = tuple(v for _, v in sorted(point.attributes.items()))
                    points[key] = point.value if hasattr(point, "value") else point
    return found


@pytest.fixture
def until(reader: InMemoryMetricReader) -> Callable[..., Any]:
    """`await until(predicate)`: collect every 0.2 s until `predicate(readings)` holds; returns the readings.
    After `timeout` seconds, returns the last readings anyway (the assertions that follow say what is wrong)."""

    async def wait(predicate: Callable[[Readings], bool], timeout: float = 20.0) -> Readings:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            found = read(reader)
            try:
                if predicate(found):
                    return found
            except (KeyError, ZeroDivisionError):
                pass
            if loop.time() > deadline:
                return found
            await asyncio.sleep(0.2)

    return wait
