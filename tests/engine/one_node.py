"""One node's engine for the tests of selector evaluation through `Engine.allocate` (test_cel_cost.py:
the budget; test_projection.py: shared verdicts): DeviceClass ``gpu`` (every device of driver
gpu.example.com) and node-a's one ResourceSlice, and a claim for one device under a selector."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

from dralloc.allocator.engine import Engine
from dralloc.schemas.resource import DeviceClass, ResourceClaim, ResourceSlice


def engine_with(devices: Iterable[str], **options: Any) -> Engine:
    """An ``Engine(**options)`` holding class ``gpu`` and node-a's slice of `devices` (each a YAML flow
    mapping, e.g. ``{name: gpu-0, attributes: {index: {int: 0}}}``)."""
    engine = Engine(**options)
    engine.apply(
        msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}, DeviceClass)
    )
    engine.apply(
        msgspec.convert(
            yaml.safe_load(f"""
metadata: {{name: node-a-gpus}}
spec:
  driver: gpu.example.com
  pool: {{name: node-a, generation: 1, resourceSliceCount: 1}}
  nodeName: node-a
  devices: [{", ".join(devices)}]
"""),
            ResourceSlice,
        )
    )
    return engine


def claim(name: str, expression: str) -> ResourceClaim:
    """Claim `name` (namespace ml) for one device of class ``gpu`` matching the CEL `expression`."""
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 1, "selectors": [{"cel": {"expression": expression}}]}}]
                }
            },
        },
        ResourceClaim,
    )
