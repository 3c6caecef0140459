"""The allocator's book of decisions (services/allocator/decisions.py), with no bus: events in,
decisions to write out, and what it undoes when it is told a write was not stored."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dralloc.allocator.decisions import Adopt, Allocate, Decisions, GangComplete, GangPlan
from dralloc.allocator.engine.gang import allocate_gang
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim, ResourceClaimStatus

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"
ONE_NODE = [{"profile": "h100-sxm", "count": 1, "prefix": "n"}]  # 8 GPUs
# Two NVLink cliques (GB200 NVL72 racks), each of two trays of 4 GPUs: a-0, a-1 | b-0, b-1.
CLIQUES = [{"profile": "gb200-nvl72", "count": 2, "prefix": "a"}, {"profile": "gb200-nvl72", "count": 2, "prefix": "b"}]


def book_over(fleet: list[dict], max_gang: int = 8, **device: Any) -> Decisions:
    """A book over the fleet's slices and the example classes; `device`: fields set on every device."""
    book = Decisions(max_gang=max_gang)
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        book.apply_inventory(event)
    for _, slices in build_fleet(fleet):
        for s in slices:
            if device:
                devices = [msgspec.structs.replace(d, **device) for d in s.spec.devices]
                s = msgspec.structs.replace(s, spec=msgspec.structs.replace(s.spec, devices=devices))
            book.apply_inventory(ev.ResourceSlicePublished(slice=s))
    return book


@pytest.fixture
def book() -> Decisions:
    return book_over(ONE_NODE)


def claim(name: str, gpus: int = 1, annotations: dict[str, str] | None = None, uid: str | None = None) -> ResourceClaim:
    return msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": uid or str(uuid.uuid4()), "generation": 1, "annotations": annotations or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )  # fmt: skip


def gang(name: str, size: int, gpus: int, domain: str | None = "") -> list[ResourceClaim]:
    """`domain`: "" any nodes (all or nothing only), None the NVLink clique."""
    marks = {"dralloc.dev/gang": name, "dralloc.dev/gang-size": str(size)}
    if domain is not None:
        marks["dralloc.dev/gang-domain"] = domain
    return [claim(f"{name}-{i}", gpus, marks) for i in range(size)]


def commit(book: Decisions, c: ResourceClaim) -> ev.AllocationCommitted:
    """What the service does for a claim of its own that fits: the commit is written."""
    assert book.submitted(c) == Allocate(c)
    outcome, event = book.allocate(c)
    assert outcome.status == "allocated" and event is not None
    book.commit_written(event)
    return event


def devices(event: ev.AllocationCommitted) -> set[str]:
    assert event.allocation is not None
    return {r.device for r in event.allocation.devices.results}


def clique(book: Decisions, node: str | None) -> str:
    return book.engine.placement.topology.domains(None)[0][node]


def held(book: Decisions) -> set[str]:
    return set(book.engine.ledger.claims)


def test_a_redelivered_committed_claim_writes_nothing(book: Decisions):
    c = claim("a", 4)
    first = commit(book, c)
    assert book.submitted(c) is None  # the same object again: nothing to write, nothing new held
    assert book.committed == {c.key: first} and held(book) == {c.key}
    assert not book.waiting


def test_a_failed_claim_retried_writes_its_failure_once(book: Decisions):
    c = claim("big", 9)  # more GPUs than the node has
    assert book.submitted(c) == Allocate(c)
    outcome, event = book.allocate(c, context="trace")
    assert event is None and outcome.status == "unsatisfiable"
    failure = book.failure(c, outcome.status, outcome.message)
    assert isinstance(failure, ev.AllocationFailed) and failure.reason == "unsatisfiable"
    book.failure_sent(failure)
    assert book.waiting == {c.key: c} and book.contexts == {c.key: "trace"}
    # The retry (the inventory changed, still no room) decides the same: nothing to write.
    outcome, _ = book.allocate(c, context="retry")
    assert book.failure(c, outcome.status, outcome.message) is None
    # A failure not sent (the bus was down) is written by the next try.
    other = claim("other", 9)
    outcome, _ = book.allocate(other)
    assert book.failure(other, outcome.status, outcome.message) is not None
    assert book.failure(other, outcome.status, outcome.message) is not None


def test_a_deleted_waiting_claim_leaves_no_decision(book: Decisions):
    c = claim("big", 9)
    outcome, _ = book.allocate(c)
    book.failure_sent(book.failure(c, outcome.status, outcome.message))  # type: ignore[arg-type]
    assert book.deleted(c.key, "another-uid") is None and c.key in book.waiting  # not this object
    assert book.deleted(c.key, c.metadata.uid or "") is None  # no release: it holds nothing
    assert not book.waiting and not book.contexts and not book.failures and not book.committed


def test_a_deleted_committed_claim_is_released_once_the_release_is_stored(book: Decisions):
    c = commit(book, claim("a", 8)).claim
    release = book.deleted(c.key, c.metadata.uid or "")
    # (It names the allocation released: a status writer clears only that one.)
    assert release == ev.AllocationReleased(namespace="ml", name="a", uid=c.metadata.uid or "", allocation=c.status.allocation)
    assert held(book) == {c.key}  # not until the release is stored
    book.release_stored(c.key)
    assert not held(book) and not book.committed
    commit(book, claim("b", 8))  # the whole node is free again


def test_a_re_created_claim_first_releases_the_old_one(book: Decisions):
    old = commit(book, claim("a", 8))
    new = claim("a", 8)  # same name, another object: the delete was missed
    release = book.submitted(new)
    assert isinstance(release, ev.AllocationReleased) and release.uid == old.claim.metadata.uid
    book.release_stored(new.key)
    assert devices(commit(book, new)) == devices(old)


def test_a_refused_commit_gives_the_devices_back(book: Decisions):
    c = claim("a", 8)
    sent = commit(book, c)
    book.commit_refused(sent)  # the write was not stored: the term is over
    assert not book.committed and not held(book)
    # A commit never sent (the send raised) gives its devices back too.
    assert book.submitted(c) == Allocate(c)
    _, event = book.allocate(c)
    assert event is not None and held(book) == {c.key}
    book.commit_not_written(c.key)
    assert not held(book) and not book.committed


def test_a_refused_commit_does_not_undo_a_later_decision_for_the_claim(book: Decisions):
    c = claim("a", 4)
    stale = commit(book, c)
    book.commit_refused(stale)
    fresh = commit(book, c)  # decided again meanwhile (by its redelivery)
    book.commit_refused(stale)  # the old write's answer comes late
    assert book.committed == {c.key: fresh} and held(book) == {c.key}


def test_a_claim_that_arrives_allocated_is_adopted(book: Decisions):
    first = commit(book, claim("a", 4))
    book.commit_refused(first)  # forget it, keep its allocation: as if allocated elsewhere
    allocated = first.claim
    step = book.submitted(allocated)
    assert isinstance(step, Adopt) and step.commit.claim == allocated and step.commit.node == first.node
    assert held(book) == {allocated.key}  # the engine holds its devices as they are
    book.commit_written(step.commit)
    assert book.submitted(allocated) is None
    _, rest = book.allocate(claim("b", 4))
    assert rest is not None and not devices(rest) & devices(first)


def test_a_gang_waits_for_all_members_then_commits_all(book: Decisions):
    members = gang("train", 2, gpus=4)
    assert book.submitted(members[0], "t0") is None  # collected: nothing written yet
    assert set(book.waiting) == {members[0].key} and not held(book)
    complete = book.submitted(members[1], "t1")
    assert complete == GangComplete("ml/train", 2, "")
    plan = book.decide_gang(complete)
    assert plan.placed and not plan.unplaced and not plan.given_back
    assert [type(e) for e in plan.batch] == [ev.AllocationCommitted, ev.AllocationCommitted]
    assert [book.contexts.get(e.key) for e in plan.batch] == ["t0", "t1"]  # each continues its own trace
    book.batch_stored(plan)
    assert set(book.committed) == {m.key for m in members} and not book.waiting and not book.gangs
    assert book.gang_held == {"ml/train": {m.key for m in members}}


def test_a_gang_that_does_not_fit_fails_whole_and_holds_nothing(book: Decisions):
    commit(book, claim("other", 2))
    members = gang("train", 2, gpus=4)  # 8 GPUs on one node; 6 are free
    assert book.submitted(members[0]) is None
    complete = book.submitted(members[1])
    assert isinstance(complete, GangComplete)
    plan = book.decide_gang(complete)
    assert not plan.placed and not plan.batch
    assert [m.key for m, _ in plan.unplaced] == [m.key for m in members]
    assert held(book) == {"ml/other"}
    for member, outcome in plan.unplaced:
        failure = book.failure(member, outcome.status, outcome.message)
        assert failure is not None
        book.failure_sent(failure)
    assert set(book.waiting) == {m.key for m in members}
    # Tried again unchanged: the same failures are not written again.
    plan = book.decide_gang(GangComplete("ml/train", 2, ""))
    assert all(book.failure(m, o.status, o.message) is None for m, o in plan.unplaced)


def test_a_gang_too_large_for_one_batch_fails_at_once():
    book = book_over(ONE_NODE, max_gang=2)
    members = gang("big", 3, gpus=1)
    failure = book.submitted(members[0])
    assert isinstance(failure, ev.AllocationFailed) and "at most 2" in failure.message
    assert not book.waiting and not book.gangs


def test_a_deleted_gang_member_leaves_its_gang(book: Decisions):
    members = gang("train", 2, gpus=4)
    assert book.submitted(members[0]) is None
    assert book.deleted(members[0].key, members[0].metadata.uid or "") is None
    assert book.submitted(members[1]) is None  # still one short: the deleted one does not count


def partly_committed(members: list[ResourceClaim]) -> tuple[Decisions, ev.AllocationCommitted]:
    """A book rebuilt from the streams an older allocator left: one member of the gang committed on its own."""
    older = book_over(CLIQUES).engine
    outcome = allocate_gang(older, members, name="ml/train")[0]
    assert outcome.status == "allocated"
    decided = msgspec.structs.replace(members[0], status=ResourceClaimStatus(allocation=outcome.allocation))
    first = ev.AllocationCommitted(claim=decided, node=outcome.node)
    book = book_over(CLIQUES)
    book.replayed(first)
    for member in members:
        book.replayed(ev.ClaimSubmitted(claim=member))
    return book, first


def test_a_partly_committed_gang_is_completed_inside_its_committed_members_clique():
    members = gang("train", 2, gpus=2, domain=None)
    book, first = partly_committed(members)
    assert book.committed == {first.key: first} and set(book.waiting) == {members[1].key}
    complete = book.submitted(members[1])
    assert isinstance(complete, GangComplete)
    plan = book.decide_gang(complete)
    assert plan.placed and not plan.given_back
    assert [e.key for e in plan.batch] == [members[1].key]  # the committed one keeps its devices
    assert clique(book, plan.batch[0].node) == clique(book, first.node)  # type: ignore[union-attr]
    book.batch_stored(plan)
    assert set(book.committed) == {m.key for m in members}


def give_back_plan(members: list[ResourceClaim]) -> tuple[Decisions, GangPlan, ev.AllocationCommitted]:
    """A partly committed gang whose clique filled up since: it is given back and decided whole."""
    book, first = partly_committed(members)
    (tray,) = [n for n in book.engine.inventory.node_rank if n != first.node and clique(book, n) == clique(book, first.node)]
    # the other tray of the first member's clique, filled by a claim the engine confines to it
    filler = claim("filler", 4)
    assert book.submitted(filler) == Allocate(filler)
    (outcome,) = book.engine.allocate([filler], within=1 << book.engine.inventory.node_rank[tray])
    assert outcome.status == "allocated" and outcome.node == tray
    decided = msgspec.structs.replace(filler, status=ResourceClaimStatus(allocation=outcome.allocation))
    book.commit_written(ev.AllocationCommitted(claim=decided, node=tray))
    complete = book.submitted(members[1])
    assert isinstance(complete, GangComplete)
    return book, book.decide_gang(complete), first


def test_a_gang_that_cannot_be_completed_in_place_is_given_back_and_placed_whole_in_one_batch():
    members = gang("train", 2, gpus=4, domain=None)
    book, plan, first = give_back_plan(members)
    assert plan.placed and [m.key for m in plan.given_back] == [first.key]
    assert [type(e).__name__ for e in plan.batch] == ["AllocationReleased", "AllocationCommitted", "AllocationCommitted"]
    cliques = {clique(book, e.node) for e in plan.batch if isinstance(e, ev.AllocationCommitted)}
    assert len(cliques) == 1 and cliques != {clique(book, first.node)}
    book.batch_stored(plan)
    assert {clique(book, book.committed[m.key].node) for m in members} == cliques
    assert not book.waiting and not book.gangs


def test_a_refused_gang_batch_re_holds_the_members_given_back():
    members = gang("train", 2, gpus=4, domain=None)
    book, plan, first = give_back_plan(members)
    book.batch_refused(plan)
    # As the stream has it: the first member holds its old devices, the other holds nothing.
    assert book.committed[first.key] is first
    assert book.engine.allocation_of(first.key) == first.allocation
    assert members[1].key not in held(book)
    assert set(book.gangs["ml/train"]) == {members[1].key}
    # Decided again, it comes to the same batch.
    again = book.decide_gang(GangComplete("ml/train", 2, None))
    assert [type(e) for e in again.batch] == [type(e) for e in plan.batch]


def test_rebuild_restores_commits_and_waits_only_for_undecided_claims(book: Decisions):
    done, open_ = claim("done", 8), claim("open", 1)
    event = commit(book, done)
    restarted = book_over(ONE_NODE)
    restarted.replayed(event)
    restarted.replayed(ev.ClaimSubmitted(claim=done))
    restarted.replayed(ev.ClaimSubmitted(claim=open_))
    assert set(restarted.committed) == {done.key} and set(restarted.waiting) == {open_.key}
    assert restarted.engine.allocation_of(done.key) == event.allocation
    outcome, _ = restarted.allocate(open_)
    assert outcome.status == "unsatisfiable"  # the node is still taken
