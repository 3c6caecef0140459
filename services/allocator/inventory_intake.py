"""Inventory events into the engine, each checked first: a slice that breaks the schema's limits or
dralloc's rule binding a node-local pool to its node is refused (and takes its earlier version
with it), named with its reason."""

from __future__ import annotations

from dralloc.allocator.engine import Engine
from dralloc.schemas import events as ev
from dralloc.schemas.limits import slice_problem
from dralloc.schemas.resource import ResourceSlice


def node_binding_problem(slice_: ResourceSlice) -> str | None:
    """dralloc's rule binding a node-local slice to its node: its pool is named after the node,
    as the node-local pools of NVIDIA's driver, DraNet, the example driver and dralloc's discovery
    are. Slices travel on ``dra.inventory.<driver>.<pool>.<slice>``, so a node's credential
    allowed only its own pool's subjects can publish nothing for another node."""
    node, pool = slice_.spec.node_name, slice_.spec.pool.name
    if node is None or pool == node:
        return None
    return f"spec.pool.name {pool!r} is not spec.nodeName {node!r} (a node-local pool is named after its node)"


def apply_inventory(engine: Engine, event: ev.Event) -> str | None:
    """An inventory event into the engine; returns why it was refused, if it was. A refused
    slice takes its earlier version with it, so that what a rebuild replays (the latest event
    per subject) and what was applied live are the same inventory."""
    match event:
        case ev.ResourceSlicePublished(slice=obj):
            if (problem := slice_problem(obj) or node_binding_problem(obj)) is not None:
                engine.remove("ResourceSlice", obj.metadata.name)
                return f"ResourceSlice {obj.metadata.name} refused: {problem}"
            engine.apply(obj)
        case ev.DeviceClassPublished(device_class=obj) | ev.NodePublished(node=obj) | ev.DeviceTaintRulePublished(rule=obj):
            engine.apply(obj)
        case ev.ResourceSliceRemoved(name=name):
            engine.remove("ResourceSlice", name)
        case ev.DeviceClassRemoved(name=name):
            engine.remove("DeviceClass", name)
        case ev.NodeRemoved(name=name):
            engine.remove("Node", name)
        case ev.DeviceTaintRuleRemoved(name=name):
            engine.remove("DeviceTaintRule", name)
    return None
