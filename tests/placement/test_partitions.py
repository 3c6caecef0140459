"""A MIG slice takes the placement that blocks the fewest partitions in use (engine/partitions.py)."""

from __future__ import annotations

from conftest import claim, devices, make_engine

from dralloc.allocator.engine.placement import PARTITION_WORDS
from dralloc.discovery.fleet import build_fleet


def test_a_3g_slice_takes_the_half_that_blocks_fewer_1g_slices_in_use():
    # gpu-0 full of 1g slices (7 in use); a 3g slice on gpu-1 at memory slices 0-3 would block
    # four free 1g placements, at 4-7 three (slice 7 takes no 1g): it goes to 4-7. The
    # topology order alone (as before partitions.py) takes the first in name order, at 0.
    engine = make_engine([("h100-sxm-mig", 1)])
    for i in range(7):
        assert devices(engine.allocate([claim(f"small-{i}", 1, mig="1g.10gb")])[0])[0].startswith("gpu-0-mig-1g10gb-")
    outcome = engine.allocate([claim("big", 1, mig="3g.40gb")], explain=True)[0]
    assert devices(outcome) == ["gpu-1-mig-3g40gb-9-4"]
    assert PARTITION_WORDS in outcome.explanation.notes


def test_a_kind_nobody_uses_costs_nothing():
    # nothing in use: every placement costs 0 and the topology order stands (the first, at 0)
    engine = make_engine([("h100-sxm-mig", 1)])
    assert devices(engine.allocate([claim("big", 1, mig="3g.40gb")])[0]) == ["gpu-0-mig-3g40gb-9-0"]


def test_the_weights_follow_the_ledger():
    # in use per kind, counted as the ledger charges and frees; a release gives the count back
    engine = make_engine([("h100-sxm-mig", 1)])
    partitions = engine.placement.partitions
    for name, profile in (("a", "1g.10gb"), ("b", "1g.10gb"), ("c", "2g.20gb")):
        engine.allocate([claim(name, 1, mig=profile)])
    assert partitions.in_use == {("gpu.nvidia.com", "1g.10gb"): 2, ("gpu.nvidia.com", "2g.20gb"): 1}
    engine.release("default/a")
    engine.release("default/c")
    assert {k: v for k, v in partitions.in_use.items() if v} == {("gpu.nvidia.com", "1g.10gb"): 1}


def test_the_weights_count_only_devices_that_exist():
    # a pool's slices removed: its held devices are gone (the ledger keeps the claims by name), so
    # they weigh nothing; the slices back, they count again
    engine = make_engine([("h100-sxm-mig", 1)])
    partitions = engine.placement.partitions
    engine.allocate([claim("a", 1, mig="1g.10gb")])
    engine.allocate([claim("c", 1, mig="2g.20gb")])
    held = {("gpu.nvidia.com", "1g.10gb"): 1, ("gpu.nvidia.com", "2g.20gb"): 1}
    assert partitions.in_use == held
    slices = [s for _, node_slices in build_fleet([("h100-sxm-mig", 1)]) for s in node_slices if s.spec.driver == "gpu.nvidia.com"]
    for s in slices:
        engine.remove("ResourceSlice", s.metadata.name)
    assert not any(partitions.in_use.values())
    for s in slices:
        engine.apply(s)
    assert {k: v for k, v in partitions.in_use.items() if v} == held


def test_a_partitions_overlaps_are_the_devices_that_cannot_be_held_with_it():
    """`Partitions.overlaps` (worked out from an index of the pool's counters) against its
    definition, device by device: the others of its pool consuming one of its counters past what that counter has left
    once it is held. Over the MIG profiles' real counters (memory slices, multiprocessors, engines,
    memory: amounts of many sizes), and the whole GPU that consumes all of them."""
    for profile in ("h200-sxm-mig", "h100-sxm-mig"):
        engine = make_engine([(profile, 1)])
        partitions = engine.placement.partitions
        pools = [pool for pool in engine.inventory.pools.values() if any(rec.consumes for rec in pool.devices)]
        assert pools
        for pool in pools:
            for rec in pool.devices:
                mine = dict(rec.consume_totals)
                expected = {
                    other.id
                    for other in pool.devices
                    if other is not rec and any(key in mine and used > pool.counters.get(key, 0) - mine[key] for key, used in other.consume_totals)
                }
                found = partitions.overlaps(rec)
                assert {other.id for other, _ in found} == expected, rec.name
                assert len(found) == len(expected)
