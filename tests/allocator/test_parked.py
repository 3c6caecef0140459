"""A claim decided as an `error` is parked (issue #11 item 6): not evaluated again at a release, a
rebuild or a resubmission of the same generation; only after the inventory changes."""

from __future__ import annotations

import msgspec
from test_core import ONE_NODE, book_over, claim

from dralloc.allocator.decisions import Allocate
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim


def failing(name: str, generation: int = 1) -> ResourceClaim:
    """A claim whose selector fails on every device: an `error`."""
    raw = msgspec.to_builtins(claim(name, uid=f"uid-{name}"))
    raw["metadata"]["generation"] = generation
    raw["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].noSuchAttribute == 1'}}]
    return msgspec.convert(raw, ResourceClaim)


def test_an_error_is_parked_not_waiting_and_a_resubmission_is_not_evaluated_again():
    book = book_over(ONE_NODE)
    bad = failing("bad")
    assert book.submitted(bad) == Allocate(bad)
    outcome, event = book.allocate(bad)
    assert outcome.status == "error" and event is None and "noSuchAttribute" in outcome.message
    assert bad.key in book.parked and bad.key not in book.waiting  # a release does not retry it
    assert book.submitted(bad) is None  # the same claim again (a re-publish): already decided
    newer = failing("bad", generation=2)
    assert book.submitted(newer) == Allocate(newer)  # a new generation is a new question


def test_the_inventory_changing_unparks_it():
    book = book_over(ONE_NODE)
    bad = failing("bad")
    book.allocate(bad)
    book.unpark()
    assert book.waiting == {bad.key: bad} and not book.parked


def test_a_deleted_parked_claim_is_forgotten():
    book = book_over(ONE_NODE)
    bad = failing("bad")
    book.allocate(bad)
    assert book.deleted(bad.key, "uid-bad") is None
    assert not book.parked and not book.waiting


def test_the_rebuild_does_not_evaluate_a_claim_that_ended_in_error():
    """ALLOCATIONS holds its `error` for this uid and generation: the rebuild parks it; a claim whose
    error was for an older generation, or that failed as unsatisfiable, waits as before."""
    book = book_over(ONE_NODE)
    bad, renewed, full = failing("bad"), failing("renewed", generation=2), claim("full", 9, uid="uid-full")
    for event in (
        ev.AllocationFailed(namespace="ml", name="bad", uid="uid-bad", generation=1, reason="error", message="x"),
        ev.AllocationFailed(namespace="ml", name="renewed", uid="uid-renewed", generation=1, reason="error", message="x"),
        ev.AllocationFailed(namespace="ml", name="full", uid="uid-full", generation=1, reason="unsatisfiable", message="x"),
        ev.ClaimSubmitted(claim=bad),
        ev.ClaimSubmitted(claim=renewed),
        ev.ClaimSubmitted(claim=full),
    ):
        book.replayed(event)
    assert set(book.parked) == {bad.key}
    assert set(book.waiting) == {renewed.key, full.key}
