"""The device plugin's side of `dralloc plan`, by counting: whole GPUs, first fit.

Under the device plugin a node offers `nvidia.com/gpu: N`, and a pod goes to the
first node (fleet order, no scoring: what `plan` has always modelled) with enough
free GPUs among the nodes its GPU labels admit. Every GPU of a node is the same
model, so no per-device search is needed: which node profiles a pod's claim
admits, and how many GPUs it takes there, is asked of the engine once per
(distinct claim spec, profile) on a probe fleet of one node per profile; the pods
are then counted onto nodes. That gives the GPUs, nodes and misfits an engine over
the whole fleet without scoring gives (`tests/migrate/test_migrate_plan.py` checks
both agree), without building or searching the whole fleet a second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.discovery.fleet import FleetSpec, fleet_inventories
from dralloc.discovery.slices import build_slices
from dralloc.schemas.resource import DeviceClass, ResourceClaim


@dataclass(slots=True)
class _Node:
    name: str
    profile: str
    free: int
    gpus: int


class FirstFit:
    """Whole-GPU first fit over a fleet; `place` takes one pod's claim spec at a time."""

    def __init__(self, spec: FleetSpec, classes: Iterable[dict]):
        first: dict[str, str] = {}  # profile -> its first node, the probe
        for node in spec.nodes:
            first.setdefault(node.profile, node.name)
        profile_of = {name: profile for profile, name in first.items()}
        self._probe = Engine(scoring=False)
        for cls in classes:
            self._probe.apply(msgspec.convert(cls, DeviceClass))
        self._probe.inventory.register_nodes(list(first.values()))
        self._rep: dict[str, str] = {}
        gpus_of: dict[str, int] = {}
        for inventory in fleet_inventories(FleetSpec(tuple(n for n in spec.nodes if first[n.profile] == n.name), spec.layout)):
            for gpu in inventory.gpus:
                gpu.mig_profiles = ()  # the device plugin hands out whole GPUs; nothing is partitioned on demand
            profile = profile_of[inventory.node]
            self._rep[profile] = inventory.node
            gpus_of[profile] = len(inventory.gpus)
            for s in build_slices(inventory, layout=spec.layout):
                self._probe.apply(s)
        self._nodes = [_Node(n.name, n.profile, gpus_of[n.profile], gpus_of[n.profile]) for n in spec.nodes]
        self._needs: dict[str, dict[str, int]] = {}
        self._probes = 0

    @property
    def fleet_gpus(self) -> int:
        return sum(n.gpus for n in self._nodes)

    def _need(self, claim_spec: dict) -> dict[str, int]:
        """Profile -> GPUs the claim takes on an empty node of that profile (absent: it does not fit there)."""
        key = json.dumps(claim_spec, sort_keys=True)
        need = self._needs.get(key)
        if need is None:
            need = {}
            for profile, node in self._rep.items():
                self._probes += 1
                claim = msgspec.convert({"metadata": {"name": f"probe-{self._probes}", "namespace": "plan"}, "spec": claim_spec}, ResourceClaim)
                (outcome,) = self._probe.allocate([claim], node=node)
                if outcome.status == "allocated" and outcome.allocation is not None:
                    need[profile] = len(outcome.allocation.devices.results)
                    self._probe.release(outcome.claim)
            self._needs[key] = need
        return need

    def place(self, claim_spec: dict) -> tuple[str, list[str]] | None:
        """The node the pod goes to and the GPUs it takes there (`node/gpu-<i>`), or None when no node has room."""
        need = self._need(claim_spec)
        if not need:
            return None
        for node in self._nodes:
            n = need.get(node.profile)
            if n is not None and node.free >= n:
                taken = [f"{node.name}/gpu-{node.gpus - node.free + i}" for i in range(n)]
                node.free -= n
                return node.name, taken
        return None
