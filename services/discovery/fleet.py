"""Fleets of simulated nodes, for the demo, tests and benchmarks.

A fleet file (YAML or JSON) lists how many nodes of which hardware profile:

    # fleet.yaml
    - {profile: h100-sxm, count: 4}
    - {profile: l40s-pcie, count: 2, prefix: infer}
    - {profile: gb200-nvl72, count: 36}      # two NVL72 racks of 18 trays
    - {profile: l40s-pcie, count: 4, sharing: memory}  # GPUs shared by memory (sharing.py: dralloc's example)

or, with a slice layout for the whole fleet:

    layout: "1.34"
    nodes:
    - {profile: h200-sxm-mig, count: 100}

`sharing: memory` publishes the entry's whole, non-MIG GPUs as multi-allocatable
by memory (KEP-5075 consumable capacity; `sharing.py`, dralloc's example: NVIDIA's
driver does not publish it); `build_fleet` applies it (`dralloc demo`, `dralloc plan`).

Nodes are named `<prefix>-<n>` (prefix defaults to the profile name, n counts
from 0 per prefix). Multi-node NVLink profiles are grouped into racks of
their rack size in order (`<prefix>-rack-<k>`).

    from dralloc.discovery.fleet import build_fleet, fleet_nodes
    build_fleet(spec) -> list[(node_name, list[ResourceSlice])]
    fleet_nodes(spec) -> list[Node]

`spec` is a path to a fleet file, the parsed document, or a list of
`(profile, count)` pairs. Thousands of nodes take seconds: a profile's
slices are built once per profile and cloned per node, changing only what
differs between nodes (names, UUIDs, NVLink domains, cliques).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dralloc.discovery.inventory import NodeInventory, node_object
from dralloc.discovery.profiles import PROFILES, simulate
from dralloc.discovery.sharing import SHARING_MODES, share_memory
from dralloc.discovery.slices import LAYOUTS, build_slices
from dralloc.manifests import read_text, why_unreadable
from dralloc.schemas.resource import Node, ResourceSlice

MAX_FLEET_NODES = 100_000


class FleetError(ValueError):
    """A fleet spec that cannot be used; the message names the entry and the field."""


@dataclass(frozen=True, slots=True)
class FleetNode:
    name: str
    profile: str
    rack: str | None
    sharing: str | None = None
    """`memory`: the node's whole GPUs are published multi-allocatable (`sharing.share_memory`, by `build_fleet`)."""


@dataclass(frozen=True, slots=True)
class FleetSpec:
    nodes: tuple[FleetNode, ...]
    layout: str = "1.35"


def load_fleet(spec: Any) -> FleetSpec:
    """A fleet spec (path, parsed document, or (profile, count) pairs) checked and expanded."""
    where = "fleet"
    if isinstance(spec, FleetSpec):
        return spec
    if isinstance(spec, (str, Path)):
        where = str(spec)
        try:
            spec = yaml.safe_load(read_text(spec))
        except (OSError, UnicodeDecodeError) as exc:
            raise FleetError(f"{where}: cannot read: {why_unreadable(exc)}") from None
        except yaml.YAMLError as exc:
            raise FleetError(f"{where}: not valid YAML: {exc}") from None
    layout = "1.35"
    if isinstance(spec, dict):
        layout = str(spec.get("layout", layout))
        if layout not in LAYOUTS:
            raise FleetError(f"{where}: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        spec = spec.get("nodes")
    if not isinstance(spec, list) or not spec:
        raise FleetError(f"{where}: expected a non-empty list of {{profile, count}} entries")
    nodes: list[FleetNode] = []
    counters: dict[str, int] = {}
    for i, entry in enumerate(spec):
        profile, count, prefix = _entry(entry, f"{where}: entry {i}")
        sharing = entry.get("sharing") if isinstance(entry, dict) else None
        hw = PROFILES[profile]
        for _ in range(count):
            n = counters.get(prefix, 0)
            counters[prefix] = n + 1
            rack = f"{prefix}-rack-{n // hw.rack_size}" if hw.rack_size else None
            nodes.append(FleetNode(f"{prefix}-{n}", profile, rack, sharing))
        if len(nodes) > MAX_FLEET_NODES:
            raise FleetError(f"{where}: more than {MAX_FLEET_NODES} nodes")
    return FleetSpec(tuple(nodes), layout)


def _entry(entry: Any, where: str) -> tuple[str, int, str]:
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        entry = {"profile": entry[0], "count": entry[1]}
    if not isinstance(entry, dict):
        raise FleetError(f"{where}: expected a mapping like {{profile: h100-sxm, count: 4}}")
    unknown = set(entry) - {"profile", "count", "prefix", "sharing"}
    if unknown:
        raise FleetError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    if "sharing" in entry and entry["sharing"] not in SHARING_MODES:
        raise FleetError(f"{where}: sharing: {entry['sharing']!r} is not one of {', '.join(SHARING_MODES)}")
    profile = entry.get("profile")
    if profile not in PROFILES:
        raise FleetError(f"{where}: profile: {profile!r} is not one of {', '.join(sorted(PROFILES))}")
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise FleetError(f"{where}: count: expected a non-negative integer, got {count!r}")
    prefix = entry.get("prefix", profile)
    if not isinstance(prefix, str) or not prefix:
        raise FleetError(f"{where}: prefix: expected a non-empty string")
    return profile, count, prefix


def fleet_inventories(spec: Any) -> Iterator[NodeInventory]:
    """One simulated inventory per fleet node, in fleet order."""
    for node in load_fleet(spec).nodes:
        yield simulate(node.profile, node.name, rack=node.rack)


def fleet_nodes(spec: Any) -> list[Node]:
    """The core/v1 Node objects of the fleet (hostname, profile, rack and clique labels)."""
    return [node_object(inv) for inv in fleet_inventories(spec)]


def build_fleet(spec: Any, *, layout: str | None = None) -> list[tuple[str, list[ResourceSlice]]]:
    """(node name, its slices) for every node of the fleet, in fleet order."""
    fleet = load_fleet(spec)
    layout = layout or fleet.layout
    out = []
    for node, inv in zip(fleet.nodes, fleet_inventories(fleet)):
        slices = build_slices(inv, layout=layout)
        out.append((inv.node, share_memory(slices) if node.sharing else slices))
    return out
