"""Checks every discovery test applies to published slices: the API's rules and the layouts' rules."""

from __future__ import annotations

from collections import defaultdict

import msgspec

from dralloc.schemas.quantity import NANO, parse_quantity
from dralloc.schemas.resource import ResourceSlice
from dralloc.schemas.validation import validate


def _amount(value: str | int) -> int:
    """A quantity in whole units, parsed by the engine (so discovery's spelling is checked against it)."""
    return parse_quantity(value) // NANO


def slice_problems(slices: list[ResourceSlice], layout: str) -> list[str]:
    """Everything wrong with one node's slices; [] when Kubernetes would take them as a consistent pool."""
    problems: list[str] = []
    pools: dict[tuple[str, str], list[ResourceSlice]] = defaultdict(list)
    for s in slices:
        # The wire form decodes with the project's schema to the same object.
        wire = msgspec.json.encode(s)
        if msgspec.json.decode(wire, type=ResourceSlice) != s:
            problems.append(f"{s.metadata.name}: does not round-trip through the schema")
        problems += [f"{s.metadata.name}: {e}" for e in validate(s)]
        pools[(s.spec.driver, s.spec.pool.name)].append(s)
        if layout == "1.35" and s.spec.devices and s.spec.shared_counters:
            problems.append(f"{s.metadata.name}: 1.35 layout mixes devices and sharedCounters")
        if layout == "1.34" and sum(len(c.counters) for c in s.spec.shared_counters) > 32:
            problems.append(f"{s.metadata.name}: 1.34 allows 32 shared counters per slice")
    for (driver, pool), members in pools.items():
        generations = {s.spec.pool.generation for s in members}
        counts = {s.spec.pool.resource_slice_count for s in members}
        if len(generations) != 1:
            problems.append(f"{driver}/{pool}: slices disagree on the generation: {generations}")
        if counts != {len(members)}:
            problems.append(f"{driver}/{pool}: resourceSliceCount {counts} but {len(members)} slices")
        names = [d.name for s in members for d in s.spec.devices]
        if len(names) != len(set(names)):
            problems.append(f"{driver}/{pool}: duplicate device names")
        pool_sets = {c.name: c for s in members for c in s.spec.shared_counters}
        for s in members:
            visible = {c.name: c for c in s.spec.shared_counters} if layout == "1.34" else pool_sets
            for d in s.spec.devices:
                for use in d.consumes_counters:
                    counter_set = visible.get(use.counter_set)
                    if counter_set is None:
                        problems.append(f"{d.name}: counter set {use.counter_set} not visible ({layout})")
                        continue
                    for name, counter in use.counters.items():
                        have = counter_set.counters.get(name)
                        if have is None or _amount(counter.value) > _amount(have.value):
                            problems.append(f"{d.name}: consumes {name}={counter.value}, the set has {have}")
    return problems
