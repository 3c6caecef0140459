"""The allocator's settings: `Config`, read from the environment (``DRALLOC_ALLOCATOR_*``,
``DRALLOC_CEL_BUDGET*``) with every value checked, so a malformed one stops the service at start
naming the variable (see the service's docstring for what each means).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from dralloc.allocator import leader
from dralloc.allocator.engine.engine import DEFAULT_CEL_BUDGET
from dralloc.allocator.moving import MODES as MOVE_MODES
from dralloc.allocator.reservations import parse_wait
from dralloc.allocator.snapshot import Policy
from dralloc.settings import one_of, overridden

DEFAULT_CEL_SECONDS = 2.0
"""A claim's selector evaluations may take this long (the benchmark fleets' claims take at most tens
of milliseconds; the reference interpreter can take seconds on one device of a selector Kubernetes
accepts)."""


@dataclass
class Config:
    ack_wait: float = 30.0
    max_deliver: int = 5
    retry_after: float = 0.1
    """Waiting claims are retried this long after the last inventory change (changes come in bursts)."""
    lease_ttl: float = leader.DEFAULT_TTL
    """A standby takes over this long after the leader's last renewal."""
    cel_budget: int = DEFAULT_CEL_BUDGET
    """Cost units a claim's selector evaluations may spend before it ends as an error (engine.py)."""
    cel_seconds: float = DEFAULT_CEL_SECONDS
    """Seconds a claim's selector evaluations may take before it ends as an error (verdicts.py)."""
    max_wait: float = 0.0
    """Seconds a large claim or gang that does not fit holds a reservation (reservations.py) unless its
    `dralloc.dev/max-wait` says otherwise; 0: only claims that say so."""
    snapshot: Policy = Policy()
    """When the leader writes the snapshot of its live decisions (snapshot_store.py)."""
    keep_whole: float = 0.0
    """Whole nodes kept for large claims per unit of recent large demand (engine/keep_whole.py); 0: off."""
    moves: str = "off"
    """When a large unit that waits gets room by moving small claims (moving.py: off, when-refused, early)."""

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        """The settings from the environment, then `overrides` (flags); raises ValueError naming a malformed variable."""
        env = os.environ
        config = cls(
            ack_wait=float(env.get("DRALLOC_ALLOCATOR_ACK_WAIT", "30")),
            max_deliver=int(env.get("DRALLOC_ALLOCATOR_MAX_DELIVER", "5")),
            lease_ttl=float(env.get("DRALLOC_ALLOCATOR_LEASE_TTL", str(leader.DEFAULT_TTL))),
            cel_budget=_cel_budget(env.get("DRALLOC_CEL_BUDGET", str(DEFAULT_CEL_BUDGET))),
            cel_seconds=_cel_seconds(env.get("DRALLOC_CEL_BUDGET_SECONDS", str(DEFAULT_CEL_SECONDS))),
            max_wait=parse_wait(env.get("DRALLOC_ALLOCATOR_MAX_WAIT", "0")),
            snapshot=_snapshot_policy(env.get("DRALLOC_ALLOCATOR_SNAPSHOT_EVERY", str(Policy.every))),
            keep_whole=_keep_whole(env.get("DRALLOC_ALLOCATOR_KEEP_WHOLE", "0")),
            moves=one_of(env.get("DRALLOC_ALLOCATOR_MOVES", "off"), MOVE_MODES, "DRALLOC_ALLOCATOR_MOVES"),
        )
        return overridden(config, overrides)


def _cel_budget(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 15 and int(text) > 0):
        raise ValueError(f"DRALLOC_CEL_BUDGET must be a positive whole number of cost units, not {text[:40]!r}")
    return int(text)


def _snapshot_policy(text: str) -> Policy:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 9 and int(text) > 0):
        raise ValueError(f"DRALLOC_ALLOCATOR_SNAPSHOT_EVERY must be a positive whole number of decisions, not {text[:40]!r}")
    return Policy(every=int(text))


def _keep_whole(text: str) -> float:
    factor = _float(text) if text.isascii() else math.nan  # float() also reads other scripts' digits
    if not 0 <= factor <= 10:  # NaN fails too
        raise ValueError(f"DRALLOC_ALLOCATOR_KEEP_WHOLE must be a factor in [0, 10] (0: off), not {text[:40]!r}")
    return factor


def _cel_seconds(text: str) -> float:
    seconds = _float(text)
    if not 0 < seconds <= 3600:
        raise ValueError(f"DRALLOC_CEL_BUDGET_SECONDS must be a number of seconds in (0, 3600], not {text[:40]!r}")
    return seconds


def _float(text: str) -> float:
    """`text` as a float, NaN when it is not one (every range check refuses NaN)."""
    try:
        return float(text)
    except ValueError:
        return math.nan
