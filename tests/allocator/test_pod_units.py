"""The book of decisions for Pods (services/allocator/decisions.py, no bus): a Pod's claims are one
unit on one node, claims wait for a Pod, and the cluster's status is the truth for cluster claims."""

from __future__ import annotations

import msgspec
from test_core import book_over, claim

from dralloc.allocator.decisions import Adopt, AllocatePod, Decisions
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim, ResourceClaimStatus

TWO_NODES = [{"profile": "h100-sxm", "count": 2, "prefix": "n"}]  # 8 GPUs each


def pod(name: str, *claims: str) -> ev.PodSubmitted:
    return ev.PodSubmitted(namespace="ml", name=name, uid=f"uid-{name}", claims=list(claims))


def node_of(commit: ev.AllocationCommitted) -> str:
    return commit.node or ""


def store(book: Decisions, step: AllocatePod) -> list[ev.AllocationCommitted]:
    plan = book.decide_pod(step)
    assert plan.batch and not plan.failures
    book.pod_stored(plan)
    return plan.batch


def test_claims_wait_for_their_pod_and_are_placed_together_with_the_pod_as_consumer() -> None:
    book = book_over(TWO_NODES)
    # Fill n-0 but one GPU: two one-GPU claims placed one by one would split (best fit takes n-0's last GPU).
    _, filler = book.allocate(claim("filler", 7))
    assert filler is not None and filler.node == "n-0"
    book.commit_written(filler)
    a, b = claim("a"), claim("b")
    assert book.submitted(a, needs_pod=True) is None and book.submitted(b, needs_pod=True) is None  # no Pod yet
    assert book.waiting == {}  # not retried alone either
    step = book.pod_submitted(pod("trainer", "a", "b"))
    assert step == AllocatePod("ml/trainer")
    commits = store(book, step)
    assert {node_of(c) for c in commits} == {"n-1"}
    assert all(c.claim.status.reserved_for[0].name == "trainer" for c in commits)
    assert book.pods == {} and book.unused == {}


def test_a_pod_waits_for_a_claim_not_here_yet_and_its_arrival_completes_it() -> None:
    book = book_over(TWO_NODES)
    assert book.pod_submitted(pod("p", "x", "y")) is None
    assert book.submitted(claim("x"), needs_pod=True) is None
    assert book.submitted(claim("y"), needs_pod=True) == AllocatePod("ml/p")


def test_a_shared_claim_already_allocated_fixes_the_node() -> None:
    book = book_over(TWO_NODES)
    shared = claim("shared")
    book.submitted(shared, needs_pod=True)
    (first,) = store(book, book.pod_submitted(pod("first", "shared")))
    book.submitted(claim("own", 8), needs_pod=True)  # a whole node: fits only where nothing is used
    plan = book.decide_pod(book.pod_submitted(pod("second", "shared", "own")))
    # The shared claim's node has 7 GPUs left: the Pod cannot run there, and nowhere else.
    assert not plan.batch and plan.failures and plan.failures[0].pod == "second"
    assert plan.failures[0].message.startswith("Pod ml/second: ")
    assert "ml/second" in book.pods_waiting
    assert book.engine.ledger.claims.get("ml/own") is None  # nothing held for a unit that did not fit
    small = claim("small", 7)
    book.submitted(small, needs_pod=True)
    (commit,) = store(book, book.pod_submitted(pod("third", "shared", "small")))
    assert node_of(commit) == node_of(first)


def test_the_cluster_holding_another_allocation_releases_ours_then_adopts_it() -> None:
    book = book_over(TWO_NODES)
    mine = claim("c")
    book.submitted(mine, needs_pod=True)
    (ours,) = store(book, book.pod_submitted(pod("p", "c")))
    # kube-scheduler's write landed first: the cluster shows another device.
    theirs_alloc = msgspec.structs.replace(
        ours.allocation,
        devices=msgspec.structs.replace(ours.allocation.devices, results=[msgspec.structs.replace(ours.allocation.devices.results[0], device="gpu-7")]),
    )
    theirs = msgspec.structs.replace(mine, status=ResourceClaimStatus(allocation=theirs_alloc))
    release = book.submitted(theirs, cluster=True, needs_pod=True)
    assert isinstance(release, ev.AllocationReleased) and release.uid == mine.metadata.uid
    book.release_stored(release.key)
    adopt = book.submitted(theirs, cluster=True, needs_pod=True)
    assert isinstance(adopt, Adopt) and adopt.commit.allocation.devices.results[0].device == "gpu-7"
    book.commit_written(adopt.commit)
    assert book.submitted(theirs, cluster=True, needs_pod=True) is None  # agrees now


def test_our_allocation_without_the_fields_the_cluster_s_gates_drop_is_still_ours() -> None:
    # Binding conditions off in the API server (the slices, written while they were on, keep them):
    # the status it stores lacks them. Still dralloc's allocation: nothing released, nothing redone.
    book = book_over(TWO_NODES, binding_conditions=["attached"], binding_failure_conditions=["failed"])
    mine = claim("c")
    book.submitted(mine, needs_pod=True)
    (ours,) = store(book, book.pod_submitted(pod("p", "c")))
    written = ours.allocation.devices.results
    assert written[0].binding_conditions == ["attached"]
    stripped = [msgspec.structs.replace(r, binding_conditions=[], binding_failure_conditions=[]) for r in written]
    kept = msgspec.structs.replace(
        ours.allocation, devices=msgspec.structs.replace(ours.allocation.devices, results=stripped), allocation_timestamp="2026-12-04T23:30:00Z"
    )
    seen = msgspec.structs.replace(ours.claim, status=msgspec.structs.replace(ours.claim.status, allocation=kept))
    assert book.submitted(seen, cluster=True, needs_pod=True) is None
    assert book.submitted(seen, cluster=True, needs_pod=True) is None  # seen again: still agrees
    # Another device there is another allocation: released as before.
    other = [msgspec.structs.replace(stripped[0], device="gpu-7" if stripped[0].device != "gpu-7" else "gpu-6")]
    theirs = msgspec.structs.replace(kept, devices=msgspec.structs.replace(kept.devices, results=other))
    release = book.submitted(msgspec.structs.replace(seen, status=msgspec.structs.replace(seen.status, allocation=theirs)), cluster=True, needs_pod=True)
    assert isinstance(release, ev.AllocationReleased)


def test_a_deallocation_by_the_cluster_is_mirrored_but_our_write_in_flight_is_not_one() -> None:
    book = book_over(TWO_NODES)
    c = claim("c")
    book.submitted(c, needs_pod=True)
    (ours,) = store(book, book.pod_submitted(pod("p", "c")))
    # The cluster shows the claim unallocated before dralloc's write landed: not a deallocation.
    assert book.submitted(c, cluster=True, needs_pod=True) is None
    written: ResourceClaim = ours.claim
    assert book.submitted(written, cluster=True, needs_pod=True) is None  # the cluster shows ours
    release = book.submitted(c, cluster=True, needs_pod=True)  # and then none: deallocated there
    assert isinstance(release, ev.AllocationReleased)
    book.release_stored(release.key)
    assert book.submitted(c, cluster=True, needs_pod=True) is None and "ml/c" in book.unused  # waits for a Pod again


def test_a_unit_split_by_the_cluster_is_placed_again_and_a_stale_view_of_it_is_not_news() -> None:
    book = book_over(TWO_NODES)
    a, b = claim("a"), claim("b")
    book.submitted(a, needs_pod=True)
    book.submitted(b, needs_pod=True)
    first = {c.key: c for c in store(book, book.pod_submitted(pod("pair", "a", "b")))}
    here = first["ml/a"].node
    # kube-scheduler took `a` on the other node before dralloc's write: release, adopt, the Pod comes back.
    there = "n-1" if here == "n-0" else "n-0"
    selector = msgspec.convert(
        {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [there]}]}]}, type(first["ml/a"].allocation.node_selector)
    )
    theirs_alloc = msgspec.structs.replace(
        first["ml/a"].allocation,
        node_selector=selector,
        devices=msgspec.structs.replace(
            first["ml/a"].allocation.devices, results=[msgspec.structs.replace(first["ml/a"].allocation.devices.results[0], pool=there)]
        ),
    )
    theirs = msgspec.structs.replace(a, status=ResourceClaimStatus(allocation=theirs_alloc))
    release = book.submitted(theirs, cluster=True, needs_pod=True)
    assert isinstance(release, ev.AllocationReleased)
    book.release_stored(release.key)
    adopt = book.submitted(theirs, cluster=True, needs_pod=True)
    assert isinstance(adopt, Adopt)
    book.commit_written(adopt.commit)
    assert "ml/pair" in book.pods_waiting
    plan = book.decide_pod(book.pod_submitted(book.pods["ml/pair"]))
    assert [type(e).__name__ for e in plan.batch] == ["AllocationReleased", "AllocationCommitted"]
    assert plan.batch[1].key == "ml/b" and plan.batch[1].node == there
    book.pod_stored(plan)
    # The cluster's older views of `b` (before dralloc's first write landed, then that write) arrive late.
    assert book.submitted(b, cluster=True, needs_pod=True) is None
    assert book.submitted(first["ml/b"].claim, cluster=True, needs_pod=True) is None
    assert book.committed["ml/b"].node == there
