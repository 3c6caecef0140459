"""The discovery service: publish this node's ResourceSlices on the bus, only on change.

    dralloc run discovery

One per node (a DaemonSet) reading NVML, or one process simulating nodes
from a hardware profile or a whole fleet file (demo, compose, benchmarks).
Every `interval` it rescans (NVML sources only: a profile does not change);
`publisher.Publisher` decides whether anything changed, and only then are
the node's slices published with a new pool generation, followed by
`ResourceSliceRemoved` for slices that no longer exist. The rescan is the
health check: an unhealthy GPU comes back tainted, a vanished one is absent
from the new generation. On stop, every slice (and the Node) is withdrawn.

At start it reads what an earlier run of the same nodes left on the bus
(INVENTORY keeps the last message per slice), so generations keep growing
across restarts and leftover slices are removed.

With `kubernetes` set, the same slices are also written to the Kubernetes
API (`kubernetes.KubernetesSlices`), as a DRA driver's kubelet plugin does.

Configuration (flags override the environment):
``DRALLOC_DISCOVERY_SOURCE`` nvml | profile | replay | fleet (default nvml),
``DRALLOC_DISCOVERY_PROFILE`` (default h100-sxm), ``DRALLOC_DISCOVERY_REPLAY``
(a capture JSON), ``DRALLOC_DISCOVERY_FLEET`` (a fleet file), ``NODE_NAME``
(default: the hostname), ``DRALLOC_DISCOVERY_INTERVAL`` (seconds, default 30),
``DRALLOC_DISCOVERY_LAYOUT`` (1.35 | 1.34), ``DRALLOC_DISCOVERY_MIG``
(true/false), ``DRALLOC_DISCOVERY_NICS`` (true/false: with NVML, also the
node's physical NICs from sysfs, as driver `dra.net`; off where DraNet runs),
``DRALLOC_DISCOVERY_KUBERNETES`` (true/false).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dralloc.bus import Bus
from dralloc.discovery.discover import default_node_name
from dralloc.discovery.fleet import fleet_inventories, load_fleet
from dralloc.discovery.inventory import NodeInventory
from dralloc.discovery.nvml import NvmlUnavailable, PynvmlSource, read_inventory
from dralloc.discovery.profiles import PROFILES, simulate
from dralloc.discovery.publisher import Publisher, SliceKey, Update
from dralloc.discovery.replay import ReplayError, ReplaySource
from dralloc.discovery.slices import LAYOUTS, Layout
from dralloc.discovery.sysfs import read_nics
from dralloc.schemas import events as ev
from dralloc.settings import env_flag, env_seconds, one_of, overridden

log = logging.getLogger("dralloc.discovery")

SOURCES = ("nvml", "profile", "replay", "fleet")
PUBLISH_BATCH = 256
"""Publishes in flight at once (a fleet of thousands of nodes starts in seconds, not minutes)."""


@dataclass
class Config:
    source: str = "nvml"
    profile: str = "h100-sxm"
    replay: str | None = None
    fleet: Any = None
    """A fleet file path, or a parsed fleet spec (what `fleet.load_fleet` takes)."""
    node: str = field(default_factory=default_node_name)
    interval: float = 30.0
    layout: Layout = "1.35"
    mig: bool = True
    nics: bool = False
    kubernetes: bool = False

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        env = os.environ
        layout = overrides.pop("layout", None) or env.get("DRALLOC_DISCOVERY_LAYOUT", "1.35")  # (the flag over the variable)
        config = cls(
            source=env.get("DRALLOC_DISCOVERY_SOURCE", "nvml"),
            profile=env.get("DRALLOC_DISCOVERY_PROFILE", "h100-sxm"),
            replay=env.get("DRALLOC_DISCOVERY_REPLAY") or None,
            fleet=env.get("DRALLOC_DISCOVERY_FLEET") or None,
            layout=one_of(layout, LAYOUTS, "slice layout"),
            interval=env_seconds("DRALLOC_DISCOVERY_INTERVAL", 30.0),
            mig=env_flag("DRALLOC_DISCOVERY_MIG", default=True),
            nics=env_flag("DRALLOC_DISCOVERY_NICS"),
            kubernetes=env_flag("DRALLOC_DISCOVERY_KUBERNETES"),
        )
        overridden(config, overrides)
        config.check()
        return config

    def check(self) -> None:
        """Raise ValueError naming the setting that cannot work."""
        if self.source not in SOURCES:
            raise ValueError(f"discovery source {self.source!r} is not one of {', '.join(SOURCES)}")
        if self.source == "profile" and self.profile not in PROFILES:
            raise ValueError(f"hardware profile {self.profile!r} is not one of {', '.join(sorted(PROFILES))}")
        if self.source == "replay" and not self.replay:
            raise ValueError("source 'replay' needs DRALLOC_DISCOVERY_REPLAY (a captured NVML inventory JSON)")
        if self.source == "fleet":
            if not self.fleet:
                raise ValueError("source 'fleet' needs DRALLOC_DISCOVERY_FLEET (a fleet file)")
            load_fleet(self.fleet)  # FleetError is a ValueError naming the entry
        if self.layout not in LAYOUTS:
            raise ValueError(f"slice layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.interval <= 0:
            raise ValueError("the scan interval must be positive")


Scan = Callable[[], list[NodeInventory]]


def scanner(config: Config) -> tuple[Scan, bool]:
    """A blocking scan of every node this process publishes, and whether rescanning can change it."""
    if config.source == "profile":
        return (lambda: [simulate(config.profile, config.node)]), False
    if config.source == "fleet":
        fleet = load_fleet(config.fleet)
        return (lambda: list(fleet_inventories(fleet))), False

    replay = config.replay if config.source == "replay" else None  # (a replay source has one: Config checks)

    def scan() -> list[NodeInventory]:
        # A fresh source per scan: a replay file may have changed, and NVML is re-initialised,
        # so a GPU that fell off the bus is seen as gone rather than cached.
        source = ReplaySource.from_file(replay) if replay is not None else PynvmlSource()
        try:
            inventory = read_inventory(source, config.node, mig=config.mig)
        finally:
            source.close()
        if config.nics and config.source == "nvml":
            inventory.nics = read_nics(config.node)
        return [inventory]

    return scan, True


async def serve(bus: Bus, config: Config, stop: asyncio.Event) -> None:
    scan, rescans = scanner(config)
    try:
        inventories = await asyncio.to_thread(scan)
    except NvmlUnavailable as exc:
        log.error("discovery: %s; no NVIDIA GPU is usable on this node (use DRALLOC_DISCOVERY_SOURCE=profile to simulate one)", exc)
        raise SystemExit(1) from None
    except ReplayError as exc:
        log.error("discovery: %s", exc)
        raise SystemExit(2) from None

    kube = await _kubernetes(config) if config.kubernetes else None
    publishers = {inv.node: Publisher(layout=config.layout) for inv in inventories}
    await _adopt(bus, publishers)
    try:
        while True:
            await _publish_all(bus, kube, publishers, inventories, config.layout)
            if not rescans:
                await stop.wait()
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), config.interval)
            if stop.is_set():
                break
            try:
                inventories = await asyncio.to_thread(scan)
            except (NvmlUnavailable, ReplayError) as exc:
                # Keep what was published: one failed scan is not proof that the GPUs are gone.
                log.warning("discovery: scan failed, keeping the last published slices: %s", exc)
                inventories = []
            except Exception:  # a bug in a reader must not take the node's slices down with it
                log.exception("discovery: scan failed unexpectedly, keeping the last published slices")
                inventories = []
    finally:
        await _withdraw(bus, kube, publishers)
        if kube is not None:
            await kube.close()


async def _adopt(bus: Bus, publishers: dict[str, Publisher]) -> None:
    """Continue above the generations an earlier run published, and remember its slices for cleanup."""
    # One node (a DaemonSet pod): read only its own subjects; a simulated fleet reads them all at once.
    only = next(iter(publishers)) if len(publishers) == 1 else None
    pattern = f"dra.inventory.*.{ev.encode_token(only)}.>" if only else "dra.inventory.>"
    events, _ = await bus.replay("INVENTORY", filter_subject=pattern)
    for event in events:
        if isinstance(event, ev.ResourceSlicePublished):
            s = event.slice
            publisher = publishers.get(s.spec.pool.name)
            if publisher is not None and s.spec.node_name == s.spec.pool.name:
                publisher.adopt(s.spec.pool.generation, [(s.spec.driver, s.spec.pool.name, s.metadata.name)])
        elif isinstance(event, ev.ResourceSliceRemoved) and event.pool in publishers:
            publishers[event.pool].adopt(event.generation, [])


async def _publish_all(bus: Bus, kube: Any, publishers: dict[str, Publisher], inventories: Sequence[NodeInventory], layout: Layout) -> None:
    updates: list[Update] = []
    for inv in inventories:
        publisher = publishers.setdefault(inv.node, Publisher(layout=layout))
        update = publisher.update(inv)
        if update is not None:
            updates.append(update)
    if not updates:
        return
    # New slices first, then removals: a consumer never sees a pool emptier than it is.
    await _send(bus, [ev.ResourceSlicePublished(slice=s) for u in updates for s in u.publish])
    await _send(bus, [_removed(key, u.generation) for u in updates for key in u.remove])
    await _send(bus, [ev.NodePublished(node=u.node) for u in updates if u.node is not None])
    changed = [u for u in updates if u.publish]
    if changed:
        log.info(
            "discovery: published %d slice(s) of %d node(s), removed %d",
            sum(len(u.publish) for u in changed),
            len(changed),
            sum(len(u.remove) for u in updates),
        )
    if kube is not None:
        await kube.apply([s for u in updates for s in u.publish], [k for u in updates for k in u.remove])


async def _withdraw(bus: Bus, kube: Any, publishers: dict[str, Publisher]) -> None:
    removals: list[SliceKey] = []
    events: list[ev.Event] = []
    for node, publisher in publishers.items():
        keys = publisher.withdraw()
        removals += keys
        events += [_removed(key, publisher.generation + 1) for key in keys]
        events.append(ev.NodeRemoved(name=node))
    try:
        await _send(bus, events)
        log.info("discovery: withdrew %d slice(s) of %d node(s)", len(removals), len(publishers))
    except Exception as exc:  # the bus may be gone at shutdown; nothing else to do but say so
        log.error("discovery: could not withdraw the slices: %s", exc)
    if kube is not None:
        await kube.apply([], removals)


def _removed(key: SliceKey, generation: int) -> ev.ResourceSliceRemoved:
    driver, pool, name = key
    return ev.ResourceSliceRemoved(name=name, driver=driver, pool=pool, generation=generation)


async def _send(bus: Bus, events: list[Any]) -> None:
    for i in range(0, len(events), PUBLISH_BATCH):
        await asyncio.gather(*(bus.publish(e) for e in events[i : i + PUBLISH_BATCH]))


async def _kubernetes(config: Config) -> Any:
    from dralloc.discovery.kubernetes import KubernetesSlices  # only when asked: keeps startup light

    try:
        return await KubernetesSlices.connect()
    except Exception as exc:  # no kubeconfig, no service account: a setup mistake, said once
        log.error("discovery: cannot write slices to Kubernetes (DRALLOC_DISCOVERY_KUBERNETES): %s", exc)
        raise SystemExit(2) from None
