"""`Decisions.gone`: which decisions the rebuild releases because CLAIMS no longer holds their claim."""

from __future__ import annotations

import msgspec

from dralloc.allocator.decisions import Decisions
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim


def committed(name: str) -> ev.AllocationCommitted:
    claim = msgspec.convert({"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": {"devices": {}}}, ResourceClaim)
    return ev.AllocationCommitted(claim=claim, node="n-0")


def test_a_decision_whose_claim_is_not_in_claims_is_released_and_no_other():
    decided: dict[str, ev.AllocationEvent] = {
        "ml/live": committed("live"),
        "ml/gone": committed("gone"),
        "ml/failed-gone": ev.AllocationFailed(namespace="ml", name="failed-gone", uid="uid-f", generation=1, reason="unsatisfiable", message="no room"),
        "ml/released": ev.AllocationReleased(namespace="ml", name="released", uid="uid-r"),  # nothing left to free
        "ml/failed-live": ev.AllocationFailed(namespace="ml", name="failed-live", uid="uid-l", generation=1, reason="error", message="x"),
    }
    releases = Decisions(max_gang=2).gone(decided, present={"ml/live", "ml/failed-live"})
    assert sorted((r.key, r.uid) for r in releases) == [("ml/failed-gone", "uid-f"), ("ml/gone", "uid-gone")]
    assert all(isinstance(r, ev.AllocationReleased) for r in releases)


def test_a_release_stored_for_a_failure_frees_nothing_and_forgets_nothing():
    book = Decisions(max_gang=2)
    book.committed["ml/other"] = committed("other")
    book.release_stored("ml/failed-gone")  # the release that supersedes a failure: nothing was held
    assert set(book.committed) == {"ml/other"}
