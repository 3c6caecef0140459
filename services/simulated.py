"""Simulated nodes for the offline commands: `--profile NAME[:COUNT]` and `--fleet FILE`.

`dralloc allocate`, `explain` and `lint` run without a system; these flags
give them nodes: the Node objects and ResourceSlices that `dralloc discover
--profile` publishes, for COUNT nodes of a profile named `<profile>-<i>`, or
for every node of a fleet file (the demo's format, `dralloc.discovery.fleet`).
A thin shell over discovery's fleet builder, kept at the top level so that
the allocator's offline runner never imports the discovery service.
"""

from __future__ import annotations

from collections.abc import Sequence

from dralloc.discovery.fleet import FleetError, FleetSpec, build_fleet, fleet_nodes, load_fleet
from dralloc.discovery.profiles import PROFILES
from dralloc.schemas.resource import Node, ResourceSlice

MAX_PROFILE_COUNT = 10_000
"""`--profile NAME:COUNT` above this is refused (the fleet file is the way to larger fleets)."""


class SimulatedNodesError(ValueError):
    """A --profile or --fleet argument that cannot be used; the message names it."""


def parse_profile(arg: str) -> tuple[str, int]:
    """`NAME[:COUNT]` -> (profile, count); raises SimulatedNodesError naming the argument."""
    name, sep, raw = arg.partition(":")
    if name not in PROFILES:
        from difflib import get_close_matches

        close = get_close_matches(name, list(PROFILES), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise SimulatedNodesError(f"--profile {arg}: unknown profile {name!r}{hint}; one of {', '.join(sorted(PROFILES))}")
    if not sep:
        return name, 1
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PROFILE_COUNT:
        raise SimulatedNodesError(f"--profile {arg}: COUNT must be a whole number from 1 to {MAX_PROFILE_COUNT}")
    return name, int(raw)


def simulated_objects(profiles: Sequence[str] = (), fleet: str | None = None) -> list[Node | ResourceSlice]:
    """Node objects and ResourceSlices for the fleet file's nodes, then each --profile's.

    Raises SimulatedNodesError when an argument is bad or two nodes would
    share a name (a fleet file whose prefix is also a --profile name).
    """
    specs: list[FleetSpec] = []
    try:
        if fleet is not None:
            specs.append(load_fleet(fleet))
        pairs = [parse_profile(p) for p in profiles]
        if pairs:
            specs.append(load_fleet(pairs))
    except FleetError as exc:
        raise SimulatedNodesError(f"--fleet {exc}") from None
    seen: set[str] = set()
    objects: list[Node | ResourceSlice] = []
    for spec in specs:
        for node in spec.nodes:
            if node.name in seen:
                raise SimulatedNodesError(f"simulated node {node.name} is named twice (--fleet and --profile); give the fleet entry another prefix")
            seen.add(node.name)
        objects += fleet_nodes(spec)
        for _, slices in build_fleet(spec):
            objects += slices
    return objects
