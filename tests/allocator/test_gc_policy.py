"""The allocator's collector policy (engine/memory.py `Collector`): what engine work leaves alive is
frozen before young collections walk it, and cycles dropped after they were frozen are still
collected: once the engine's idle work is done and the frozen objects have grown, and, under
claims that never stop, past a bound, so that memory of a long churn stays bounded."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dralloc.allocator.engine import memory

TRACKED = 6
"""Objects the collector tracks per `Cyclic`: itself, its padding and the 4 lists in it."""


class Cyclic:
    """A claim's state as the ledger might hold it: it points at itself, so only the collector frees it."""

    __slots__ = ("me", "padding", "__weakref__")

    def __init__(self) -> None:
        self.me = self
        self.padding = [[] for _ in range(4)]


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[memory.Collector]:
    """A loaded Collector in this (test) process, its growth bounds small so that a churn of a few
    hundred thousand objects crosses them; the collector as it was afterwards."""
    monkeypatch.setattr(memory, "FULL_AFTER_GROWTH", 1.5)
    monkeypatch.setattr(memory, "FULL_FORCED_GROWTH", 3.0)
    threshold = gc.get_threshold()
    gc.collect()
    policy = memory.Collector()
    policy.loaded()
    try:
        yield policy
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.collect()


def churn(policy: memory.Collector, rounds: int, per_round: int, live: list[Cyclic]) -> tuple[list[weakref.ref[Cyclic]], int]:
    """Rounds of engine work: each makes `per_round` new cyclic objects kept in `live` and drops as
    many of the oldest, then settles. The dropped ones (weakly), and the most of them not collected
    yet at any settle."""
    dropped: list[weakref.ref[Cyclic]] = []
    freed = [0]
    most = 0
    for _ in range(rounds):
        live.extend(Cyclic() for _ in range(per_round))
        old, live[:] = live[:per_round], live[per_round:]
        dropped.extend(weakref.ref(o, lambda _: freed.__setitem__(0, freed[0] + 1)) for o in old)
        del old
        policy.settle()
        most = max(most, len(dropped) - freed[0])
    return dropped, most


def test_what_engine_work_leaves_alive_is_frozen_before_a_young_collection(collector: memory.Collector):
    frozen = gc.get_freeze_count()
    kept = [Cyclic() for _ in range(memory.FREEZE_AT // TRACKED + 1)]
    assert gc.get_count()[0] >= memory.FREEZE_AT
    collector.settle()
    assert gc.get_count()[0] == 0
    assert gc.get_freeze_count() >= frozen + len(kept)


def test_a_little_work_is_not_frozen(collector: memory.Collector):
    frozen = gc.get_freeze_count()
    kept = [Cyclic() for _ in range(10)]
    collector.settle()
    assert gc.get_freeze_count() < frozen + len(kept)  # left to the young collection


def test_cycles_dropped_after_a_freeze_are_collected_once_the_engine_is_idle_and_they_have_grown(collector: memory.Collector):
    per_round = memory.FREEZE_AT // TRACKED // 4
    live = [Cyclic() for _ in range(2 * per_round)]
    baseline = collector.baseline
    dropped, _ = churn(collector, 2, per_round, live)
    collector.idle()  # grown by less than FULL_AFTER_GROWTH: no collection
    assert collector.baseline == baseline and any(ref() is not None for ref in dropped)
    growth = int(baseline * (memory.FULL_AFTER_GROWTH - 1))
    more, _ = churn(collector, growth // (per_round * TRACKED) + 2, per_round, live)
    dropped += more
    assert collector.baseline == baseline  # not forced: this waits for the engine's idle work
    assert any(ref() is not None for ref in dropped)  # frozen: the young collections do not see them
    collector.idle()
    assert all(ref() is None for ref in dropped)
    assert all(o.me is o for o in live)  # (what is still held, kept)


def test_claims_that_never_stop_keep_memory_bounded(collector: memory.Collector):
    baseline = collector.baseline
    per_round = memory.FREEZE_AT // TRACKED // 4
    live = [Cyclic() for _ in range(2 * per_round)]
    # Objects dropped: three times the forced bound's growth (without collections, frozen grows by that much).
    dropped, most = churn(collector, int(3 * (memory.FULL_FORCED_GROWTH - 1) * baseline / TRACKED) // per_round + 1, per_round, live)
    # (the bound grows with what is held, the test's own weak references: the last full collection's)
    assert collector.baseline > baseline
    assert most <= (memory.FULL_FORCED_GROWTH - 1) * collector.baseline / TRACKED + per_round
    assert sum(1 for ref in dropped if ref() is None) >= len(dropped) // 2
    assert all(o.me is o for o in live)
