"""The topology model: which devices sit close together, per node and across nodes.

Built from what discovery publishes on the devices (`dralloc.dev/nvlinkDomain`,
`dralloc.dev/pcieSwitch`, `resource.kubernetes.io/pcieRoot`,
`dralloc.dev/numaNode`, `dralloc.dev/nvlinkClique`, shared counter sets and
NVIDIA's `uuid`/`parentUUID`) and on the nodes (labels such as
`nvidia.com/gpu.clique` or `dralloc.dev/rack`).

Per node, a networkx graph links every device to hubs (its physical GPU, its
NVLink domain, PCIe switch, PCIe root, NUMA node); the connected components
of the edges of one level are that level's groups. PCIe levels are
cumulative (a device that shares a switch with a device of NUMA node 0 is on
NUMA node 0 too, even if its own attribute is missing), so they nest:
switch within root within NUMA node. A device without an attribute is a group
of its own at that level (it is close to nothing there).

The graph is built when a node's devices change (the inventory's per-node
stamp), never per claim: the hot path reads `NodeTopology.groups`, a tuple of
small integers per device, and compares them.

Across nodes, each node belongs to one multi-node domain at most (the NVLink
clique of GB200 NVL72 trays, from the devices or the node label, else its
rack label; or the value of any node label a gang names): the domains gangs
stay in are those groups, rebuilt when the inventory changes (`Engine.warm`
builds them before a claim needs them).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from dralloc.allocator.engine.inventory import (
    AttrValue,
    CounterSetKey,
    DeviceRec,
    Inventory,
    Pool,
    attribute_value,
    lookup_attribute,
    value_set,
)

# Levels, tightest first. NODE is implicit (every device of a NodeTopology is on its node).
GPU, NVLINK, SWITCH, ROOT, NUMA, NODE = range(6)
LEVEL_NAMES = (
    "physical GPU",
    "NVLink domain",
    "PCIe switch",
    "PCIe root",
    "NUMA node",
    "node",
)
GROUP_LEVELS = (GPU, NVLINK, SWITCH, ROOT, NUMA)

NVLINK_DOMAIN = "dralloc.dev/nvlinkDomain"
NVLINK_CLIQUE = "dralloc.dev/nvlinkClique"
PCIE_SWITCH = "dralloc.dev/pcieSwitch"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "dralloc.dev/numaNode"

CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""NVIDIA GPU feature discovery's node label for the NVLink clique of a multi-node NVLink node."""
RACK_LABEL = "dralloc.dev/rack"

# Which edge levels make a level's groups (PCIe levels accumulate, see above).
_EDGES = {
    GPU: {GPU},
    NVLINK: {NVLINK},
    SWITCH: {SWITCH},
    ROOT: {SWITCH, ROOT},
    NUMA: {SWITCH, ROOT, NUMA},
}


@dataclass(slots=True)
class NodeTopology:
    node: str
    stamp: tuple[int]  # the node's local version when this was built
    groups: dict[int, tuple[int, ...]]
    """Device id -> group index per level in GROUP_LEVELS order (GPU, NVLINK, SWITCH, ROOT, NUMA)."""
    names: list[dict[int, str]]
    """Per level: group index -> a name a person recognises (`pci0000:15`, `NUMA 1`), for groups that have one."""
    sizes: list[dict[int, int]]
    """Per level: group index -> number of devices in it (all kinds)."""
    clique: str | None
    """The multi-node NVLink clique the node's devices report, if any."""
    devices: int
    lo: int
    """The lowest device id (bitsets of the node are shifted by it)."""
    flat: bool
    """No two devices share a group at any level: nothing to prefer (the order stays Kubernetes')."""
    masks: Masks
    """Per level: (group index, size, bitset of its devices) for groups of two or more devices,
    largest first: the locality scan counts a group's free devices with one `&` and `bit_count()`.
    Bitsets here are shifted by `lo` (bit 0: the node's first device), so they stay small."""
    special: int
    """Devices (shifted by `lo`) that are shared (allowMultipleAllocations) or consume counters
    (MIG): their free count is not one bit each, so the scan counts them device by device."""
    span: int
    """All of the node's device bits, shifted by `lo`."""
    shape: int
    """The serial of the node's structure (`Shape`): nodes of one hardware profile share it,
    so an order worked out for one (by device position) holds for the others."""
    verdicts: dict[Any, tuple[int, int]] = field(default_factory=dict)
    """Selector verdict key -> (matched, failed) of the node's devices (shifted by `lo`):
    placement's cache (`Placement.local_verdict`). A node's verdict does not change while its
    devices do not (the key names the class version and selectors), and this topology is
    rebuilt when they change, so the cache goes with it."""
    values: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    """Attribute name -> `value_bits` of the node (its cache; rebuilt with this topology)."""


def _counter_sets(rec: DeviceRec, pools: dict[tuple[str, str], Pool]) -> list[CounterSetKey]:
    """The counter sets the device draws on, each once, in order."""
    if rec.counter_set is not None:
        return [rec.counter_set]
    set_of = pools[(rec.driver, rec.pool)].counter_sets  # (several sets: rare)
    return list(dict.fromkeys(set_of[key] for key, _ in rec.consumes))


def _hubs(rec: DeviceRec, pools: dict[tuple[str, str], Pool]) -> list[tuple[int, object]]:
    """(level, hub) pairs a device links to, in level order (GPU first, then `_LEVEL_ATTRIBUTES`),
    each once."""
    # one hub per counter set consumed (a MIG partition names a dozen counters of one set)
    out: list[tuple[int, object]] = [(GPU, ("counters", counter_set)) for counter_set in _counter_sets(rec, pools)] if rec.consumes else []
    attrs = rec.spec.attributes
    for own in ("uuid", "parentUUID"):
        attr = attrs.get(own)
        if attr is not None and attr.string:
            hub = (GPU, ("uuid", rec.driver, attr.string))
            if hub not in out:  # (a parentUUID equal to the uuid: the only hub that can repeat)
                out.append(hub)
    for level, name in _LEVEL_ATTRIBUTES:
        # read from the spec, not through `rec.attribute`: its per-device memo would keep four
        # entries on every device of the fleet for a lookup made once per node build
        value = attribute_value(rec, name)
        if value is not None:
            out.append((level, value))
    return out


_LEVEL_ATTRIBUTES = ((NVLINK, NVLINK_DOMAIN), (SWITCH, PCIE_SWITCH), (ROOT, PCIE_ROOT), (NUMA, NUMA_NODE))


def _hub_name(level: int, hub: object) -> str:
    if level == NUMA:
        return f"NUMA {hub}"
    if level == GPU and isinstance(hub, tuple):
        return str(hub[-1])
    return str(hub)


Hub = tuple[int, object]
"""(level, hub): a device's physical GPU, NVLink clique, PCIe switch, root complex or NUMA node (`_hubs`)."""
Hubs = tuple[Hub, ...]
"""A device's hubs, sorted."""
ShapeKey = tuple[tuple[tuple[int, int], ...], ...]
"""Per device position, its hubs with each hub renamed to its first-seen number: equal for nodes of one shape."""
Masks = list[list[tuple[int, int, int]]]
"""`NodeTopology.masks`: per level, (group index, size, bitset of its devices) for groups of two or more."""
Shape = tuple[list[tuple[int, ...]], list[dict[int, int]], list[tuple[tuple[int, int, int], ...]], int, Masks, bool]
"""A node's structure by device position: group tuple per device, group sizes per level,
per level where each named group's name is (group index, the position of its first device,
the index in that device's hubs of its first hub at the level: a group without one has no
name), a serial number (nodes with the same serial have the same structure), the group
masks with bit p for position p (the masks of every node whose device ids run without a
gap, shared by them) and whether it is flat (every group of one device)."""

_serials = itertools.count(1)


def build_node(
    node: str,
    recs: list[DeviceRec],
    stamp: tuple[int],
    pools: dict[tuple[str, str], Pool],
    shapes: dict[ShapeKey, Shape] | None = None,
    last_names: dict[int, list[dict[int, str]]] | None = None,
) -> NodeTopology:
    """The topology of one node's devices (networkx graph, components per level).

    Devices with the same hubs (a GPU and its MIG partitions) share one graph
    vertex, which keeps the graph of a MIG node as small as that of its GPUs.
    Nodes of one hardware profile have one shape (the same hubs up to their
    names): with `shapes`, the graph is built once per shape, not per node.
    With `last_names` (shape serial -> the names of the node of that shape built
    last), a level whose group names equal that node's shares its dict (PCIe
    roots and NUMA nodes are named alike on every node of a profile: ~600 bytes
    a node). `pools`: the inventory's, where a device's counter sets are named. Read-only, like the
    shape's parts."""
    # each device's hubs without repeats, by level (`_hubs` gives them in level order; within a
    # level in its order, which is the same on every node of a profile, so their shape keys agree)
    hub_lists = [tuple(_hubs(rec, pools)) for rec in recs]
    lo = min((rec.id for rec in recs), default=0)
    if not any(hub_lists):  # no topology published at all: every device alone, no graph needed
        n = len(recs)
        return NodeTopology(
            node=node, stamp=stamp, groups={rec.id: (i,) * len(GROUP_LEVELS) for i, rec in enumerate(recs)},
            names=[{} for _ in GROUP_LEVELS], sizes=[dict.fromkeys(range(n), 1) for _ in GROUP_LEVELS],
            clique=None, devices=n, lo=lo, flat=True, masks=[[] for _ in GROUP_LEVELS],
            special=sum(1 << (rec.id - lo) for rec in recs if rec.multi or rec.consumes),
            span=sum(1 << (rec.id - lo) for rec in recs), shape=0,
        )  # fmt: skip
    canon: dict[Hub, int] = {}
    shape_key = tuple([tuple([(hub[0], canon.setdefault(hub, len(canon))) for hub in hubs]) for hubs in hub_lists])
    shape = shapes.get(shape_key) if shapes is not None else None
    if shape is None:
        shape = _shape(hub_lists)
        if shapes is not None:
            if len(shapes) > 1024:
                shapes.clear()
            shapes[shape_key] = shape
    by_position, sizes, namers, serial, by_position_masks, flat = shape
    names = [{gid: _hub_name(level, hub_lists[p][k][1]) for gid, p, k in named} for level, named in zip(GROUP_LEVELS, namers)]
    if last_names is not None:
        before = last_names.get(serial)
        if before is not None:
            names = [same if same == mine else mine for same, mine in zip(before, names)]
        elif len(last_names) > 1024:
            last_names.clear()
        last_names[serial] = names
    cliques = sorted({v for rec in recs if (v := attribute_value(rec, NVLINK_CLIQUE)) is not None})
    # a node's ids usually run without a gap (its pools' ids are handed out together): its masks
    # are then its shape's, shared (not a list of bitsets per node, ~1 KB a node at 31,250 nodes)
    gapless = all(rec.id == lo + p for p, rec in enumerate(recs))
    masks = by_position_masks if gapless else _masks([rec.id - lo for rec in recs], by_position, sizes)
    return NodeTopology(
        node=node,
        stamp=stamp,
        groups={rec.id: g for rec, g in zip(recs, by_position)},
        names=names,
        sizes=sizes,
        clique=cliques[0] if cliques else None,
        devices=len(recs),
        lo=lo,
        flat=flat,
        masks=masks,
        special=sum(1 << (rec.id - lo) for rec in recs if rec.multi or rec.consumes),
        span=(1 << len(recs)) - 1 if gapless else sum(1 << (rec.id - lo) for rec in recs),
        shape=serial,
    )


def _masks(offsets: list[int], by_position: list[tuple[int, ...]], sizes: list[dict[int, int]]) -> Masks:
    """`NodeTopology.masks` of devices at bit `offsets[p]` for position p, largest group first. Read-only
    (shared by the nodes of a shape)."""
    masks: Masks = []
    for pos in range(len(GROUP_LEVELS)):
        bits: dict[int, int] = {}
        for offset, g in zip(offsets, by_position):
            bits[g[pos]] = bits.get(g[pos], 0) | 1 << offset
        masks.append(sorted(((gid, sizes[pos][gid], b) for gid, b in bits.items() if sizes[pos][gid] > 1), key=lambda t: (-t[1], t[0])))
    return masks


def _shape(hub_lists: list[Hubs]) -> Shape:
    """Groups per level by device position: connected components of each level's edges."""
    alike: dict[Hubs, list[int]] = {}
    for p, hubs in enumerate(hub_lists):
        alike.setdefault(hubs, []).append(p)
    graphs = {level: nx.Graph() for level in GROUP_LEVELS}
    for sig in alike:
        for level, hub in sig:
            for target in GROUP_LEVELS:
                if level in _EDGES[target]:
                    graphs[target].add_edge(("sig", sig), (level, hub))
    per_device: list[list[int]] = [[] for _ in hub_lists]
    sizes: list[dict[int, int]] = []
    namers: list[tuple[tuple[int, int, int], ...]] = []
    for level in GROUP_LEVELS:
        level_sizes: dict[int, int] = {}
        level_first: dict[int, int] = {}
        seen: set[int] = set()
        # components ordered by their first device, so group indexes (and ties) are deterministic
        components = sorted(sorted(p for v in comp if v[0] == "sig" for p in alike[v[1]]) for comp in nx.connected_components(graphs[level]))
        index = 0
        for members in components:
            for p in members:
                per_device[p].append(index)
                seen.add(p)
            level_sizes[index] = len(members)
            level_first[index] = members[0]
            index += 1
        for p in range(len(hub_lists)):  # alone at this level
            if p not in seen:
                per_device[p].append(index)
                level_sizes[index] = 1
                level_first[index] = p
                index += 1
        sizes.append(level_sizes)
        # a group's name is its first device's first hub at the level, if it has one
        firsts = ((gid, p, next((k for k, (lv, _) in enumerate(hub_lists[p]) if lv == level), -1)) for gid, p in level_first.items())
        namers.append(tuple(named for named in firsts if named[2] >= 0))
    groups = [tuple(g) for g in per_device]
    flat = all(size == 1 for level_sizes in sizes for size in level_sizes.values())
    return groups, sizes, namers, next(_serials), _masks(list(range(len(hub_lists))), groups, sizes), flat


class Topology:
    """Per-node topologies and multi-node domains of an inventory, rebuilt only when it changes."""

    def __init__(self, inventory: Inventory) -> None:
        self.inv = inventory
        self._nodes: dict[str, NodeTopology] = {}
        self._shapes: dict[ShapeKey, Shape] = {}
        self._last_names: dict[int, list[dict[int, str]]] = {}  # (build_node's `last_names`)
        self._domains: dict[str | None, tuple[int, dict[str, str], dict[str, list[str]]]] = {}
        """Label -> (`_domain_stamp` it was worked out for, `domains`' answer)."""
        self._domain_stamp = 0
        """Bumped when what the domains are made of may have changed: a Node object (its labels,
        whether it is known), or a node's clique (`_cliques`). Not by every inventory change: a
        slice republished, a class published, leave the domains as they were, and working them
        out again is a pass over every node (~21 ms at 31,250 nodes, native)."""
        self._cliques: dict[str, str] = {}
        """Node -> the NVLink clique its devices report (`_clique`), for the nodes that report one."""
        self._clique_stale: set[str] = set()
        """Nodes whose devices changed since their clique was last read: read again by `domains`."""
        self._bits: dict[str | None, tuple[dict[str, list[str]], dict[str, int]]] = {}
        self._unions: dict[str | None, tuple[dict[str, int], int]] = {}
        self.nvlink_ranks = 0
        """Ranks of the nodes with at least one device on an NVLink domain (kept as pools change)."""
        self.eager = False
        """Build a node's topology when its pools change (placement sets it with scoring on), so a
        claim never pays for it; off, it is built on first use (`dralloc explain`)."""
        self._pending: set[str] = set()
        """Eager mode: nodes whose topology may be out of date, built once the rebuilds move on to
        other nodes, by `warm`, or on first use: those changed by the latest pool rebuilds (a node
        publishing several slices, GPUs and NICs, in a row is built once, not once per slice), and
        those whose Node object came, changed or went since (`_node_changed`)."""
        inventory.on_pool_rebuilt.append(self._pool_rebuilt)
        inventory.on_node_changed.append(self._node_changed)

    def _node_changed(self, node: str) -> None:
        """A node's Node object came, changed or went: its labels are news to the domains. In eager
        mode a node with devices is pending too: no pool rebuild follows to build it again."""
        self._domain_stamp += 1
        if self.eager and self.inv.local.span(node)[1]:
            self._pending.add(node)

    def _pool_rebuilt(self, pool: Pool, old_devices: list[DeviceRec]) -> None:
        inv = self.inv
        touched = {rec.local_node for rec in (*pool.devices, *old_devices) if rec.local_node is not None}
        self._clique_stale |= touched
        for node in touched:
            bit = 1 << inv.rank_of(node)
            devices = (inv.devices[i] for i in inv.local.ids(node))
            if any(rec is not None and attribute_value(rec, NVLINK_DOMAIN) is not None for rec in devices):
                self.nvlink_ranks |= bit
            else:
                self.nvlink_ranks &= ~bit
        if self.eager:
            settled, self._pending = self._pending - touched, touched
            for node in sorted(settled):
                self.node(node)

    def warm(self, end: float) -> bool:
        """Eager mode's idle work: build the topology of every node whose devices or labels changed
        since it was built (a node's Node object arriving after its slices makes its topology stale
        and no pool rebuild follows), until `end` (`time.perf_counter`, looked at every 8 nodes);
        True while some is left. A claim's walk would otherwise build them on its way, ~0.3 ms a
        node of 8 GPUs and 8 NICs. Nothing a decision reads depends on when a topology is built.
        Only the nodes changed since are looked at: a pass over every node after each change
        was half of a round's work while a fleet's Node objects and slices arrived one by one."""
        if not self.eager:
            return False
        pending = self._pending
        built = 0
        while pending:
            node = pending.pop()
            if self.inv.local.span(node)[1]:  # (its devices may have gone since)
                self.node(node)
            built += 1
            if built % 8 == 0 and time.perf_counter() >= end and pending:
                return True
        return False

    def node(self, node: str | None) -> NodeTopology | None:
        """The node's topology (its node-local devices), built on first use after a change."""
        if node is None:
            return None
        inv = self.inv
        stamp = (inv._local_version.get(node, 0),)
        topo = self._nodes.get(node)
        if topo is None or topo.stamp != stamp:
            self._pending.discard(node)
            recs = [rec for i in inv.local.ids(node) if (rec := inv.devices[i]) is not None]
            topo = self._nodes[node] = build_node(node, recs, stamp, inv.pools, self._shapes, self._last_names)
        return topo

    def domains(self, label: str | None = None) -> tuple[dict[str, str], dict[str, list[str]]]:
        """(node -> domain, domain -> nodes in rank order) for the multi-node domains.

        `label` None: the NVLink clique (a device's `dralloc.dev/nvlinkClique`,
        else the node label `nvidia.com/gpu.clique`), else the `dralloc.dev/rack`
        label. A label key: nodes that share its value. Nodes without one are in
        no domain. A domain is named by its value (a clique and a rack of the
        same value are two domains: the later one by its first node is
        `<kind>:<value>`, e.g. `rack:x`, prefixed again while that name is
        taken), in the order of its first node.
        Worked out again only when a Node object or a node's clique changed since (`_domain_stamp`)."""
        inv = self.inv
        if self._clique_stale:
            self._read_cliques()
        hit = self._domains.get(label)
        if hit is not None and hit[0] == self._domain_stamp:
            return hit[1], hit[2]
        # A node links to one hub at most (its clique, else its rack; or the label's value), so a
        # domain is a hub's nodes: grouped in one pass, in the order of each hub's first node.
        by_hub: dict[tuple[str, str], list[str]] = {}
        for name in inv.nodes():
            labels = inv.node_labels.get(name, {})
            if label is None:
                clique = self._cliques.get(name) or labels.get(CLIQUE_LABEL)
                hub = ("clique", clique) if clique else ("rack", labels[RACK_LABEL]) if labels.get(RACK_LABEL) else None
            else:
                hub = ("label", labels[label]) if labels.get(label) else None
            if hub is not None:
                by_hub.setdefault(hub, []).append(name)
        of: dict[str, str] = {}
        members: dict[str, list[str]] = {}
        rank = inv.node_rank
        for (kind, value), nodes in by_hub.items():
            # a clique and a rack of the same value are two domains; the prefix is repeated until the
            # name is free (a label's value may itself read `rack:x`)
            domain = value
            while domain in members:
                domain = f"{kind}:{domain}"
            members[domain] = nodes = sorted(nodes, key=rank.__getitem__)
            for n in nodes:
                of[n] = domain
        self._domains[label] = (self._domain_stamp, of, members)
        return of, members

    def _read_cliques(self) -> None:
        """Read the clique of each node whose devices changed since (`_clique_stale`) into `_cliques`;
        one that differs from before changes the domains (`_domain_stamp`)."""
        for node in self._clique_stale:
            clique = self._clique(node)
            if clique != self._cliques.get(node):
                if clique is None:
                    del self._cliques[node]
                else:
                    self._cliques[node] = clique
                self._domain_stamp += 1
        self._clique_stale.clear()

    def _clique(self, node: str) -> str | None:
        """The NVLink clique the node's devices report (without building the node's topology): its
        topology's (`NodeTopology.clique`: the first in order, should they report several)."""
        topo = self._nodes.get(node)
        if topo is not None and topo.stamp == (self.inv._local_version.get(node, 0),):
            return topo.clique
        devices = self.inv.devices
        cliques: list[str] = [
            value for i in self.inv.local.ids(node) if (rec := devices[i]) is not None and (value := attribute_value(rec, NVLINK_CLIQUE)) is not None
        ]
        return min(cliques, default=None)

    def domain_bits(self, label: str | None = None) -> dict[str, int]:
        """Domain -> bitset of its nodes' ranks (see `domains`)."""
        _, members = self.domains(label)
        hit = self._bits.get(label)
        if hit is not None and hit[0] is members:
            return hit[1]
        rank = self.inv.node_rank
        bits = {d: sum(1 << rank[n] for n in nodes) for d, nodes in members.items()}
        self._bits[label] = (members, bits)
        union = 0
        for b in bits.values():
            union |= b
        self._unions[label] = (bits, union)
        return bits

    def domain_union(self, label: str | None = None) -> int:
        """The node ranks in any multi-node domain (the union of `domain_bits`), kept with it."""
        bits = self.domain_bits(label)
        hit = self._unions.get(label)
        if hit is None or hit[0] is not bits:
            union = 0
            for b in bits.values():
                union |= b
            hit = self._unions[label] = (bits, union)
        return hit[1]


def value_bits(inv: Inventory, topo: NodeTopology, attribute: str) -> tuple[int, tuple[int, ...]]:
    """(the node's devices that have `attribute`, and per value of it the devices holding that
    value as matchAttribute compares them: `DeviceRec.values`), bitsets shifted by `lo`. Cached on
    the topology, which is rebuilt when the node's devices change: a matchAttribute's groups on a
    node are then one `&` and `bit_count()` per value, not an attribute lookup per device."""
    hit = topo.values.get(attribute)
    if hit is None:
        having = 0
        per: dict[AttrValue, int] = {}
        for i in topo.groups:
            rec = inv.devices[i]
            # read once per device for the node's life: without the attribute memo's columns
            found = value_set(lookup_attribute(rec, attribute)) if rec is not None else None
            if found is None:
                continue
            bit = 1 << (i - topo.lo)
            having |= bit
            for value in found:
                per[value] = per.get(value, 0) | bit
        hit = topo.values[attribute] = (having, tuple(per.values()))
    return hit


def level_of(topo: NodeTopology, ids: list[int]) -> int:
    """The tightest level at which all the devices are in one group (NODE if only the node is shared).

    The NVLink level counts only when every device has an NVLink domain."""
    if not ids:
        return NODE
    groups = [g for i in ids if (g := topo.groups.get(i)) is not None]
    if len(groups) != len(ids):
        return NODE
    for pos, level in enumerate(GROUP_LEVELS):
        first = groups[0][pos]
        if all(g[pos] == first for g in groups):
            if level == NVLINK and first not in topo.names[pos]:
                continue  # one device alone "in" no domain
            return level
    return NODE
