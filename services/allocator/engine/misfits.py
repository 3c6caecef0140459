"""What failed on a node, remembered until something there changes.

A claim that does not fit on a node fails there again, for the same reason,
as long as nothing that node's search reads has changed: the devices usable
from the node (the inventory's version), what the ledger holds of them and of
their pools' counters (`Ledger.node_changes`, and `remote_changes` for devices
local to no node), and the claim's shape. Near full, and for claims that fit
nowhere, the engine tries many nodes per claim and most attempts repeat an
earlier one exactly: this memo answers those from a dict.

The shape is everything `Engine._place` reads of a one-claim unit, except the
claim's name, which only appears in the message (`Misfit.message` puts it
back). Keys hold the shape's number (`Misfits.shape`), not the shape: a tuple
nested four deep, hashed again at every lookup (CPython keeps no tuple's hash),
cost more than the rest of a lookup together. Units of several claims are not
remembered. A remembered failure also keeps the search steps it spent, so that
the unit's step budget runs out exactly where it would have (`Engine._place`
charges them again).

Per claim shape it also keeps the node ranks whose remembered failure still
holds (`known`, a bitset brought up to date from the ledger's log of changed
nodes): the engine leaves those nodes out of a unit's walk instead of
recalling them one by one, so a claim that fits nowhere costs what changed
since the last such claim, not a pass over the fleet. A node left out is not
in the refusal's count of nodes tried, and its remembered steps are not
charged.

Pure: no I/O; the engine owns one and consults it per (unit, node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dralloc.allocator.engine.inventory import Inventory
from dralloc.allocator.engine.ledger import Ledger
from dralloc.allocator.engine.plan import ClaimPlan

MAX_ENTRIES = 200_000
"""Remembered failures before the memo starts over (each is a small tuple; stale ones are never hit again)."""


@dataclass(slots=True, frozen=True)
class Misfit:
    """A remembered failure: the message with the claim's name left out, and what raising it takes."""

    claimed: bool  # the message starts with "claim <key>, " (put back by `message`)
    text: str
    why: Any  # engine.Why (not imported: the engine imports this module)
    steps: int

    def message(self, claim: str) -> str:
        return f"claim {claim}, {self.text}" if self.claimed else self.text


class Misfits:
    def __init__(self, inventory: Inventory, ledger: Ledger) -> None:
        self.inv = inventory
        self.ledger = ledger
        self._memo: dict[tuple[Any, ...], Misfit] = {}
        self._nodes: set[str] = set()  # nodes with a remembered failure: elsewhere no key is built
        self._shapes: dict[tuple[Any, ...], int] = {}
        """Claim shape -> its number (`shape`): numbers are never given twice, so a plan holding
        one from before the memo started over still names its own shape."""
        self._next_shape = 0
        self._ranks: dict[int, list[int]] = {}
        """Claim shape's number -> [node ranks whose failure holds, ledger log position they are up to,
        inventory version, remote changes] (`known`)."""

    def key(self, plans: list[ClaimPlan], node: str | None) -> tuple[Any, ...] | None:
        """The memo key of placing `plans` on `node` now; None: not remembered (several claims)."""
        if len(plans) != 1 or node is None:
            return None
        shape = self.shape(plans[0])
        ledger = self.ledger
        return (shape, node, self.inv.version, ledger.node_changes.get(node, 0), ledger.remote_changes)

    def recall(self, plans: list[ClaimPlan], node: str | None) -> Misfit | None:
        """The failure remembered for placing `plans` on `node` now, if any (a set lookup on a
        node where nothing failed: the usual first try costs no key)."""
        if node not in self._nodes:
            return None
        key = self.key(plans, node)
        return self._memo.get(key) if key is not None else None

    def known(self, plans: list[ClaimPlan]) -> int:
        """The ranks of the nodes where placing `plans` is remembered to fail now (a bitset; 0 for
        several claims): the same nodes `recall` would answer for, found without visiting them."""
        if len(plans) != 1:
            return 0
        entry = self._ranks.get(self.shape(plans[0]))
        if entry is None:
            return 0
        return self._current(entry)

    def shape(self, plan: ClaimPlan) -> int:
        """The number of the plan's shape (`shape_of`), kept on the plan (and so on the plans
        made from the same template): one hash of the shape per template, not one per lookup."""
        number = plan.shape
        if number is None:
            shape = shape_of(plan)
            number = self._shapes.get(shape)
            if number is None:
                number = self._shapes[shape] = self._next_shape
                self._next_shape += 1
            plan.shape = number
        return number

    def _current(self, entry: list[int]) -> int:
        """`entry`'s ranks less the nodes changed since it last looked (all of them when the
        inventory, the network-attached devices or more than the ledger's log have changed)."""
        ledger = self.ledger
        bits, position, version, remote = entry
        log, base = ledger.touched, ledger.touched_base
        if version != self.inv.version or remote != ledger.remote_changes or position < base:
            bits = 0
        elif bits:
            # each distinct node once: a node changes again and again between two looks of a
            # shape (churn-mixed: 18 entries, 9 nodes), and each test makes a new int
            for r in set(log[position - base :]):
                if (bits >> r) & 1:
                    bits ^= 1 << r
        entry[:] = [bits, base + len(log), self.inv.version, ledger.remote_changes]
        return bits

    def note(self, plans: list[ClaimPlan], ranks: int) -> None:
        """Remember that placing `plans` on the nodes of `ranks` (a bitset of node ranks) fails
        now, without trying them (placement found too few free matching devices there,
        `Placement.order_nodes`, which notes the nodes it passed together): they are left out
        of later walks of the same shape (`known`) until they change. Nothing is kept to
        recall: the one such node the engine still tries, for the refusal's message, is tried
        for real."""
        if len(plans) != 1:
            return
        entry = self._ranks.setdefault(self.shape(plans[0]), [0, 0, -1, -1])
        self._current(entry)
        entry[0] |= ranks

    def put(self, key: tuple[Any, ...] | None, plan: ClaimPlan, message: str, why: Any, steps: int) -> None:
        if key is None:
            return
        prefix = f"claim {plan.key}, "
        claimed = message.startswith(prefix)
        if not claimed and plan.key in message:
            return  # a message naming the claim elsewhere: not reusable for another claim
        if len(self._memo) >= MAX_ENTRIES:
            self._memo.clear()
            self._nodes.clear()
            self._ranks.clear()
            self._shapes.clear()
        self._nodes.add(key[1])
        entry = self._ranks.setdefault(key[0], [0, 0, -1, -1])
        self._current(entry)  # (the key was taken now: its failure holds now)
        entry[0] |= 1 << self.inv.node_rank[key[1]]
        self._memo[key] = Misfit(claimed=claimed, text=message[len(prefix) :] if claimed else message, why=why, steps=steps)


def shape_of(plan: ClaimPlan) -> tuple[Any, ...]:
    """Everything placing the claim reads except its name: per request, per alternative, the
    selector key, counts and modes, capacity, tolerations and names written into messages;
    the constraints (`Misfits.shape` numbers it, once per plan)."""
    requests = tuple(
        (
            request.name,
            tuple(
                (
                    alt.result_name,
                    alt.base,
                    alt.sub,
                    alt.verdict_key,
                    alt.class_key,
                    alt.all_mode,
                    alt.count,
                    alt.admin,
                    tuple(sorted(alt.capacity.items())) if alt.capacity else None,
                    tuple((t.key, t.operator, t.value, t.effect) for t in alt.tolerations),
                    alt.constraint_attributes,
                )
                for alt in request.alts
            ),
        )
        for request in plan.requests
    )
    constraints = tuple((c.attribute, c.match, tuple(sorted(c.requests))) for c in plan.constraints)
    return (requests, constraints)
