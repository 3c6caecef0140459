"""Whole nodes kept for large claims, in proportion to the large demand seen recently (#18).

A *large* placement takes every device of its kind on a node: an 8-GPU claim on an 8-GPU
node, a gang member on a 4-GPU tray. Best fit already breaks whole nodes last; this goes
one step further. Per node group (the device kind and the node's hardware shape: the nodes
of one profile), an exponentially decayed count of the large placements seen over the last
`horizon` claims placed anywhere (a clock that needs no time: the engine is pure) gives the
number of whole nodes of the group a smaller unit may not break: round(factor x count), at
most `cap`. A unit that fits only on those is refused for now (it waits, as any claim that
does not fit, and is tried again when devices are freed). Large units are never held back.

`factor` 0, the default, turns it off: it trades small claims refused for large claims
placed (`dralloc bench placement --keep-whole` measures both), so it is an operator's choice.
"""

from __future__ import annotations

import math

from dralloc.allocator.engine.inventory import DeviceKind, iter_bits

HORIZON = 256
"""Claims placed (anywhere) over which a large placement's weight falls to 1/e."""
CAP = 3
"""At most this many whole nodes kept per group."""

Group = tuple[DeviceKind, int]
"""(device kind, node shape serial): nodes of one hardware profile, for one kind of device."""


class KeepWhole:
    """The decayed large demand per node group, and how many whole nodes it keeps."""

    def __init__(self, factor: float = 0.0, horizon: int = HORIZON, cap: int = CAP) -> None:
        self.factor = factor
        self.horizon = horizon
        self.cap = cap
        self.tick = 0
        """Claims placed so far (the clock of the decay)."""
        self._seen: dict[Group, tuple[float, int]] = {}
        """Group -> (decayed count, the tick it was last brought up to date)."""

    def placed(self) -> None:
        """One more claim placed somewhere: time moves on by one tick."""
        self.tick += 1

    def large(self, group: Group) -> None:
        """A large placement in `group` (a claim took every device of the kind on one of its nodes)."""
        self._seen[group] = (self.demand(group) + 1.0, self.tick)

    def demand(self, group: Group) -> float:
        """The group's large placements, each weighted exp(-age / horizon) (age in claims placed)."""
        value, at = self._seen.get(group, (0.0, self.tick))
        return value * math.exp(-(self.tick - at) / self.horizon) if value else 0.0

    def keep(self, group: Group) -> int:
        """Whole nodes of the group a smaller unit may not break now (0 when off)."""
        if self.factor <= 0:
            return 0
        return min(self.cap, int(self.factor * self.demand(group) + 0.5))

    def groups(self, kind: DeviceKind) -> list[tuple[Group, int]]:
        """(group, nodes to keep) for the groups of `kind` that keep at least one now."""
        if self.factor <= 0:
            return []
        out = []
        for group in self._seen:
            if group[0] == kind and (k := self.keep(group)) > 0:
                out.append((group, k))
        return out


# --- nodes held for a unit that waits (reservations) ----------------------------------------
#
# A reservation is a preference: other units try held nodes last and take them when nothing else
# fits. Two refinements, measured on `dralloc bench placement` (README "Levers measured"):
# a held node that is whole again is kept from smaller units outright (a gang waiting for its
# last node must not lose the ones already whole), and a smaller unit that must take a held node
# takes the one least likely to drain first.


def held_whole(held: int, whole: int, totals: dict[str, int], names: list[str], need: int) -> int:
    """The node ranks a unit taking `need` devices of a kind may not take: nodes held for a unit
    that waits (`held`, node ranks) that are whole (`whole`: every device of the kind free) and
    have more devices of the kind (`totals`: node -> devices of the kind) than the unit takes.
    A unit as large as the node may take it (the usual order: held nodes last). 0: none."""
    out = 0
    for rank in iter_bits(held & whole):
        if totals.get(names[rank], 0) > need:
            out |= 1 << rank
    return out


def drain_last(ranks: int, names: list[str], known: set[str], on: dict[str, dict[str, int]], free: dict[str, int]) -> list[str]:
    """The held nodes of `ranks` in the order a smaller unit takes them when nothing else fits:
    the most claims holding devices there first (`on`: node -> claim -> devices; with durations
    that do not depend on age, each claim is one more departure to wait for, so such a node is
    the least likely to drain within the wait), then the fewest free (`free`: of the unit's kind;
    best fit), then rank. Only known nodes."""
    out = []
    for rank in iter_bits(ranks):
        name = names[rank]
        if name in known:
            out.append((-len(on.get(name, {})), free.get(name, 0), rank, name))
    return [n for *_, n in sorted(out)]
