"""`explain` says, in words, why the placement was chosen and what the next best was."""

from __future__ import annotations

from conftest import claim, devices, make_engine


def test_explain_compares_the_choice_with_the_next_best_node():
    engine = make_engine([("l40s-pcie", 2)])
    devices(engine.allocate([claim("one", 1)])[0])  # gpu-0 on l40s-pcie-0
    outcome = engine.allocate([claim("pair", 2)], explain=True)[0]
    notes = outcome.explanation.notes
    assert notes[0] == "placement on node l40s-pcie-0: same PCIe switch (l40s-pcie-0/pcie-switch-1); node 12% full (1 of 8 matching devices in use before)"
    assert notes[1] == "locality: same PCIe switch (the tightest this node's hardware allows)"
    assert notes[2] == "next best: node l40s-pcie-1: same PCIe switch; node 0% full (0 of 8 matching devices in use before)"
    assert (
        notes[3]
        == "hole left: 5 of 8 matching devices free (awkward: not a power of two; best fit prefers nodes it leaves a power of two free, at equal fullness)"
    )


def test_explain_says_what_hole_the_choice_leaves_and_that_a_reserved_node_was_taken_last():
    engine = make_engine([("l40s-pcie", 2)])
    devices(engine.allocate([claim("six", 6)], node="l40s-pcie-0")[0])  # 2 free
    devices(engine.allocate([claim("seven", 7)], node="l40s-pcie-1")[0])  # 1 free
    outcome = engine.allocate([claim("one", 1)], explain=True)[0]
    assert outcome.node == "l40s-pcie-1" and outcome.explanation.notes[-1] == "hole left: none (all 8 matching devices of the node in use)"
    # l40s-pcie-0 held for a claim that waits: a 2-GPU claim fits nowhere else, takes it, and says so
    inv = engine.inventory
    engine.reserve(sum(1 << rec.id for rec in inv.devices if rec is not None and rec.local_node == "l40s-pcie-0"))
    outcome = engine.allocate([claim("two", 2)], explain=True)[0]
    assert outcome.node == "l40s-pcie-0"
    assert outcome.explanation.notes[-1] == (
        "reserved: node l40s-pcie-0 holds devices reserved for a claim that waits; taken because no node without one could hold this claim"
    )


def test_explain_says_when_the_hardware_allowed_better():
    engine = make_engine([("l40s-pcie", 1)])
    for i in range(8):
        assert devices(engine.allocate([claim(f"s{i}", 1)])[0]) == [f"gpu-{i}"]
    for i in (1, 3, 5, 7):
        engine.release(f"default/s{i}")  # one free GPU per switch
    outcome = engine.allocate([claim("pair", 2)], explain=True)[0]
    assert devices(outcome) == ["gpu-1", "gpu-3"]
    assert outcome.explanation.notes[1:] == [
        "locality: same NUMA node (the hardware allows same PCIe switch, but not enough of it is free)",
        "next best: none; no other node could hold it now",
        "hole left: 2 of 8 matching devices free (a useful block: a power of two)",
    ]


def test_explain_with_scoring_off_says_so():
    engine = make_engine([("l40s-pcie", 1)], scoring=False)
    outcome = engine.allocate([claim("pair", 2)], explain=True)[0]
    assert outcome.explanation.notes == ["placement: scoring is off; the first valid devices in Kubernetes' order were taken"]


def test_explain_of_a_large_claim_that_does_not_fit_names_what_it_would_hold_while_it_waits():
    engine = make_engine([("l40s-pcie", 2)])
    for name, gpus, node in (("a", 2, "l40s-pcie-0"), ("b", 2, "l40s-pcie-0"), ("c", 4, "l40s-pcie-1")):
        devices(engine.allocate([claim(name, gpus)], node=node)[0])
    outcome = engine.allocate([claim("eight", 8)], explain=True)[0]
    assert outcome.status == "unsatisfiable"
    # l40s-pcie-1 waits for one claim to leave, l40s-pcie-0 for two: the closest is l40s-pcie-1
    assert outcome.explanation.notes[-1] == (
        "if it may wait (dralloc.dev/max-wait), the allocator holds for it what is closest to fitting "
        "(other claims take it last; it waits for the claims there to leave): node l40s-pcie-1 (4 of 8 devices in use, by default/c)"
    )
    # a small claim holds nothing while it waits (it fits in the holes claims leave anywhere)
    devices(engine.allocate([claim("d", 4)], node="l40s-pcie-1")[0])
    devices(engine.allocate([claim("e", 4)], node="l40s-pcie-0")[0])
    small = engine.allocate([claim("one", 1)], explain=True)[0]
    assert small.status == "unsatisfiable" and not any("may wait" in note for note in small.explanation.notes)
