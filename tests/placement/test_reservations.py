"""Reservations for what waits (services/allocator/reservations.py through the book of decisions,
no bus): a large claim that does not fit holds the node closest to fitting it, small claims take
that node last, and the reservation ends when the claim is placed, deleted or its wait is over."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.decisions import Decisions
from dralloc.allocator.reservations import parse_wait
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"
TWO_NODES = [{"profile": "h100-sxm", "count": 2, "prefix": "n"}]  # n-0, n-1: 8 GPUs each
NOW = 1_000_000.0


def book_over(fleet: list[dict], max_wait: float = 0.0) -> Decisions:
    book = Decisions(max_gang=8, max_wait=max_wait)
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        book.apply_inventory(event)
    for _, slices in build_fleet(fleet):
        for s in slices:
            book.apply_inventory(ev.ResourceSlicePublished(slice=s))
    return book


def claim(name: str, gpus: int, annotations: dict[str, str] | None = None) -> ResourceClaim:
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4()), "generation": 1, "annotations": annotations or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )  # fmt: skip


def busy(book: Decisions) -> None:
    """n-0: one 4-GPU claim (4 free, 1 claim to wait for); n-1: three 1-GPU claims (5 free, 3)."""
    engine = book.engine
    assert engine.allocate([claim("four", 4)], node="n-0")[0].status == "allocated"
    for i in range(3):
        assert engine.allocate([claim(f"one-{i}", 1)], node="n-1")[0].status == "allocated"


def waiting_big(book: Decisions, wait: str = "10m") -> tuple[ResourceClaim, list[ev.AllocationFailed]]:
    big = claim("big", 8, {"dralloc.dev/max-wait": wait})
    outcome, commit = book.allocate(big)
    assert (outcome.status, commit) == ("unsatisfiable", None)
    return big, book.reserve_waiting(NOW)


def test_a_large_claim_that_waits_holds_the_node_with_the_fewest_claims_to_wait_for():
    book = book_over(TWO_NODES)
    busy(book)
    big, failures = waiting_big(book)
    (failure,) = failures
    assert failure.key == "ml/big" and failure.reserved_nodes == ["n-0"] and failure.reserved_until == NOW + 600
    assert "n-0 reserved for it" in failure.message
    assert book.reserve_waiting(NOW + 1) == []  # nothing changed: nothing to write again


def test_small_claims_avoid_reserved_devices_unless_nothing_else_fits():
    control = book_over(TWO_NODES)
    busy(control)
    assert control.allocate(claim("small", 4))[0].node == "n-0"  # best fit: the 4-GPU hole

    book = book_over(TWO_NODES)
    busy(book)
    waiting_big(book)
    assert book.allocate(claim("small", 4))[0].node == "n-1"  # n-0 is held for the big claim
    # n-1 has one GPU left: a second 4-GPU claim fits only on the reserved node, and takes it
    assert book.allocate(claim("small-2", 4))[0].node == "n-0"


def test_the_reservation_ends_when_the_claim_is_placed():
    book = book_over(TWO_NODES)
    busy(book)
    big, _ = waiting_big(book)
    book.engine.release("ml/four")
    outcome, commit = book.allocate(big)
    assert outcome.status == "allocated" and outcome.node == "n-0"
    book.commit_written(commit)
    assert book.reservations.held == {} and book.engine.placement.reserved == 0
    assert book.reserve_waiting(NOW + 1) == []


def test_the_reservation_ends_when_the_claim_is_deleted():
    book = book_over(TWO_NODES)
    busy(book)
    big, _ = waiting_big(book)
    assert book.deleted(big.key, big.metadata.uid) is None  # nothing committed to release
    assert book.reservations.held == {} and book.engine.placement.reserved == 0
    assert book.allocate(claim("small", 4))[0].node == "n-0"  # best fit again


def test_the_reservation_ends_when_the_wait_is_over_and_the_claim_keeps_waiting():
    book = book_over(TWO_NODES)
    busy(book)
    big, _ = waiting_big(book, "90s")
    (ended,) = book.reserve_waiting(NOW + 90)
    assert ended.key == "ml/big" and ended.reserved_nodes == [] and ended.reserved_until == NOW + 90
    assert "reserved" not in ended.message
    assert book.engine.placement.reserved == 0 and big.key in book.waiting
    assert book.reserve_waiting(NOW + 200) == []  # over is over: no new reservation


def test_a_small_claim_that_waits_reserves_nothing():
    book = book_over(TWO_NODES)
    busy(book)
    book.allocate(claim("fill", 5))  # n-1 full: 4 free on n-0 only
    outcome, _ = book.allocate(claim("five", 5, {"dralloc.dev/max-wait": "10m"}))
    assert outcome.status == "unsatisfiable"
    assert book.reserve_waiting(NOW) == [] and book.reservations.held == {}


def test_the_service_default_applies_without_an_annotation_and_zero_turns_it_off():
    book = book_over(TWO_NODES, max_wait=120)
    busy(book)
    outcome, _ = book.allocate(claim("big", 8))
    (failure,) = book.reserve_waiting(NOW)
    assert failure.reserved_until == NOW + 120

    off = book_over(TWO_NODES, max_wait=120)
    busy(off)
    off.allocate(claim("big", 8, {"dralloc.dev/max-wait": "0"}))
    assert off.reserve_waiting(NOW) == []


def test_a_bad_max_wait_is_named_in_the_failure_and_the_default_applies():
    book = book_over(TWO_NODES)
    busy(book)
    big = claim("big", 8, {"dralloc.dev/max-wait": "soon"})
    outcome, _ = book.allocate(big)
    assert book.reserve_waiting(NOW) == []  # default 0: no reservation
    failure = book.failure(big, outcome.status, outcome.message)
    assert "dralloc.dev/max-wait: 'soon' is not a duration" in failure.message


@pytest.mark.parametrize(("text", "seconds"), [("600", 600), ("600s", 600), ("10m", 600), ("1h30m", 5400), ("0", 0), ("2.5m", 150)])
def test_max_wait_durations(text: str, seconds: float):
    assert parse_wait(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "-5", "5d", "1h 30m", "m"])
def test_max_wait_refuses_what_is_not_a_duration(text: str):
    with pytest.raises(ValueError, match="dralloc.dev/max-wait"):
        parse_wait(text)


def test_an_older_claim_keeps_its_node_and_a_later_one_holds_the_next_closest():
    book = book_over([{"profile": "h100-sxm", "count": 3, "prefix": "n"}])
    busy(book)
    assert book.engine.allocate([claim("two", 2)], node="n-2")[0].status == "allocated"
    first, _ = waiting_big(book)
    second = claim("big-2", 8, {"dralloc.dev/max-wait": "10m"})
    book.allocate(second)
    (failure,) = book.reserve_waiting(NOW + 5)  # the first one's reservation did not change
    assert book.reservations.held["ml/big"].nodes == ("n-2",)  # one claim to wait for, 6 free
    assert failure.key == "ml/big-2" and failure.reserved_nodes == ["n-0"]  # the next: one claim, 4 free


def gang_fleet() -> Decisions:
    """Two NVLink cliques of two trays (4 GPUs each): a-0 has one 3-GPU claim (a: 1 claim to wait
    for, 5 free), b-0 and b-1 one 1-GPU claim each (b: 2 claims, 6 free). No gang of two 4-GPU
    members fits in either."""
    book = book_over([{"profile": "gb200-nvl72", "count": 2, "prefix": "a"}, {"profile": "gb200-nvl72", "count": 2, "prefix": "b"}])
    engine = book.engine
    assert engine.allocate([claim("x", 3)], node="a-0")[0].status == "allocated"
    assert engine.allocate([claim("y", 1)], node="b-0")[0].status == "allocated"
    assert engine.allocate([claim("z", 1)], node="b-1")[0].status == "allocated"
    return book


def test_a_gang_that_waits_holds_the_nodes_of_the_domain_closest_to_holding_it():
    control = gang_fleet()
    assert control.allocate(claim("small", 1))[0].node == "a-0"  # best fit: the fullest clique's last GPU

    book = gang_fleet()
    marks = {"dralloc.dev/gang": "train", "dralloc.dev/gang-size": "2", "dralloc.dev/max-wait": "5m"}
    members = [claim(f"train-{i}", 4, marks) for i in range(2)]
    steps = [book.submitted(m) for m in members]
    plan = book.decide_gang(steps[-1])
    assert not plan.placed
    failures = book.reserve_waiting(NOW)
    assert {f.key for f in failures} == {"ml/train-0", "ml/train-1"}
    assert all(f.reserved_nodes == ["a-0", "a-1"] and f.reserved_until == NOW + 300 for f in failures)
    assert book.allocate(claim("small", 1))[0].node in {"b-0", "b-1"}  # clique a is held for the gang
    # a member deleted: the gang is no longer all here, and holds nothing
    book.deleted("ml/train-0", members[0].metadata.uid)
    assert book.reservations.held == {} and book.engine.placement.reserved == 0


def full_but_clique_a(book: Decisions) -> None:
    """`gang_fleet`, with clique b filled: only a-0 (1 free) and a-1 (4 free) have room."""
    for node in ("b-0", "b-1"):
        assert book.engine.allocate([claim(f"fill-{node}", 3)], node=node)[0].status == "allocated"


def tray_gang_waits(book: Decisions) -> None:
    """A gang of two 4-GPU claims (5 minutes' wait) that does not fit yet, holding clique a's tray (a-0, a-1)."""
    marks = {"dralloc.dev/gang": "train", "dralloc.dev/gang-size": "2", "dralloc.dev/max-wait": "5m"}
    steps = [book.submitted(claim(f"train-{i}", 4, marks)) for i in range(2)]
    assert not book.decide_gang(steps[-1]).placed
    book.reserve_waiting(NOW)
    assert book.reservations.held["gang:ml/train"].nodes == ("a-0", "a-1")


def test_a_held_node_whole_again_is_kept_from_smaller_claims_but_not_from_one_as_large():
    control = gang_fleet()
    full_but_clique_a(control)
    assert control.allocate(claim("small", 1))[0].node == "a-0"
    assert control.allocate(claim("small-2", 1))[0].node == "a-1"  # nothing held: it breaks the whole tray

    book = gang_fleet()
    full_but_clique_a(book)
    tray_gang_waits(book)
    assert book.allocate(claim("small", 1))[0].node == "a-0"  # held, but not whole: taken last, as before
    # a-1 is whole and held for the gang: a smaller claim is refused (it waits) rather than break it
    outcome = book.engine.allocate([claim("small-2", 1)], explain=True)[0]
    assert outcome.status == "unsatisfiable"
    assert "held whole for a claim that waits: node a-1 (every device free" in " ".join(outcome.explanation.notes)
    refused = claim("small-3", 1)
    refused_outcome, _ = book.allocate(refused)
    failure = book.failure(refused, refused_outcome.status, refused_outcome.message)  # what `dralloc get claims` shows
    assert refused_outcome.status == "unsatisfiable" and "; held whole for a claim that waits: node a-1" in failure.message
    # a claim as large as the tray is not held back (for it the hold is the usual preference)
    assert book.allocate(claim("tray", 4))[0].node == "a-1"


def test_a_smaller_claim_that_must_take_a_held_node_takes_the_one_with_the_most_claims_first():
    book = book_over([{"profile": "h100-sxm", "count": 3, "prefix": "n"}])
    engine = book.engine
    assert engine.allocate([claim("four", 4)], node="n-0")[0].status == "allocated"  # 1 claim, 4 free
    for i in range(2):
        assert engine.allocate([claim(f"one-{i}", 1)], node="n-1")[0].status == "allocated"  # 2 claims, 6 free
        assert engine.allocate([claim(f"half-{i}", 4)], node="n-2")[0].status == "allocated"  # 2 claims, full
    waiting_big(book)
    book.allocate(claim("big-2", 8, {"dralloc.dev/max-wait": "10m"}))
    book.reserve_waiting(NOW)
    assert book.reservations.held["ml/big"].nodes == ("n-0",) and book.reservations.held["ml/big-2"].nodes == ("n-1",)
    # only held nodes have room. Best fit alone would take n-0 (4 free, leaving a block of 2); n-1
    # has two claims to wait for, n-0 one: n-1 is the less likely to drain, so it is taken first
    assert book.allocate(claim("small", 2))[0].node == "n-1"


def test_with_the_held_node_rules_off_a_held_node_whole_again_is_only_tried_last():
    # moves at the wait's end (moving.configure "when-refused") turn the rules off: a-1, whole and
    # held for the gang, is taken by a smaller claim when nothing else fits, as any held node
    book = gang_fleet()
    book.engine.placement.held_rules = False
    full_but_clique_a(book)
    tray_gang_waits(book)
    assert book.allocate(claim("small", 1))[0].node == "a-0"
    assert book.allocate(claim("small-2", 1))[0].node == "a-1"
