"""Moves in a cluster (services/allocator/evicting.py): for a large Pod that does not fit, the claims of
the Pods in its way are chosen by the moves planner and their Pods' eviction asked for, once while it
is in flight; only claims reserved for Pods are evicted. And an EvictionRequested in ALLOCATIONS never
stands for a claim's decision: a successor rebuilds the same state through a snapshot or the whole stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec
from test_core import book_over, claim
from test_pod_units import TWO_NODES, pod, store
from test_snapshot import claim_event, publish_fleet, standby, state, submit

from dralloc.allocator import evicting, moving, reservations
from dralloc.allocator.claims import unit_key
from dralloc.allocator.decisions import AllocatePod, Decisions, GangComplete
from dralloc.allocator.engine.inventory import device_kind
from dralloc.allocator.service import Allocator
from dralloc.bus import client as bus_client
from dralloc.bus.streams import REFUSAL_TTL_S
from dralloc.schemas import events as ev
from dralloc.schemas import snapshot as fmt
from dralloc.schemas.resource import DeviceClass, ResourceClaim, ResourceClaimConsumerReference


def scattered(book: Decisions, *, pods: bool = True) -> dict[str, list[str]]:
    """Eight 2-GPU claims fill both 8-GPU nodes (as Pods' units, or claims of their own); two leave each
    node: node -> the keys of the two left there (4 GPUs free on each, none whole)."""
    on: dict[str, list[str]] = {}
    for i in range(8):
        name = f"s{i}"
        if pods:
            assert book.submitted(claim(name, 2), needs_pod=True) is None
            (commit,) = store(book, book.pod_submitted(pod(name, name)))
        else:
            _, commit = book.allocate(claim(name, 2))
            assert commit is not None
            book.commit_written(commit)
        on.setdefault(commit.node or "", []).append(commit.key)
    assert sorted(len(keys) for keys in on.values()) == [4, 4]
    for node, keys in on.items():
        for key in keys[:2]:
            release = book.deleted(key, "")
            assert release is not None
            book.release_stored(key)
            book.pod_deleted(key, "")
        on[node] = keys[2:]
    return on


def waiting_big(book: Decisions) -> None:
    assert book.submitted(claim("big", 8), needs_pod=True) is None
    step = book.pod_submitted(pod("big", "big"))
    assert step == AllocatePod("ml/big")
    plan = book.decide_pod(step)
    assert not plan.batch and plan.failures


def test_the_pods_on_the_node_the_planner_empties_are_asked_to_go_once_while_in_flight() -> None:
    book = book_over(TWO_NODES)
    on = scattered(book)
    waiting_big(book)
    requests = evicting.decide(book, "ml/big", 1000.0)
    assert len(requests) == 2
    (node,) = {r.node for r in requests}
    assert sorted(r.key for r in requests) == sorted(on[node])
    for request in requests:
        name = request.name
        assert request.pods == [ResourceClaimConsumerReference(resource="pods", name=name, uid=f"uid-{name}")]
        assert (request.for_namespace, request.for_pod) == ("ml", "big")
        assert request.subject == f"dra.allocations.ml.{name}.evict"
    assert book.engine.ledger.claims.keys() == {k for keys in on.values() for k in keys}  # nothing moved in place
    # In flight: nothing more is asked, and the waiting Pod's failure says what was asked.
    assert evicting.decide(book, "ml/big", 1001.0) == []
    plan = book.decide_pod(AllocatePod("ml/big"))
    (failure,) = plan.failures
    assert "dralloc asked to evict Pod(s)" in failure.message and f"on node {node}" in failure.message
    # After the patience, it may be asked again (the Pods are still there: a budget refused).
    assert len(evicting.decide(book, "ml/big", 1000.0 + evicting.EVICTION_PATIENCE)) == 2
    # The devices it would get there are held for it meanwhile: a newcomer goes to the other node
    # (4 GPUs free on each: without the hold, the lower rank would take it).
    assert book.reservations.evicting["pod:ml/big"]
    _, newcomer = book.allocate(claim("newcomer", 2))
    assert newcomer is not None and newcomer.node != node
    book.commit_written(newcomer)


def test_deciding_the_pod_with_moves_on_plans_its_evictions_and_its_failures_tell_of_them() -> None:
    """`decide_pod(step, evict_at)`: one decision gives the Pod's failures and the evictions for it, the
    failures already naming what was asked and the node held (as `reservedNodes`); without `evict_at`
    (moves off) nothing is asked."""
    book = book_over(TWO_NODES)
    on = scattered(book)
    assert book.submitted(claim("big", 8), needs_pod=True) is None
    step = book.pod_submitted(pod("big", "big"))
    assert isinstance(step, AllocatePod)
    off = book.decide_pod(step)
    assert off.evictions == [] and off.failures and book.evictions.inflight == {}
    plan = book.decide_pod(step, 1000.0)
    assert not plan.batch and len(plan.evictions) == 2
    (node,) = {r.node for r in plan.evictions}
    assert sorted(r.key for r in plan.evictions) == sorted(on[node])
    (failure,) = plan.failures
    assert "dralloc asked to evict Pod(s)" in failure.message and f"{evicting.HELD_WORDS} node {node}" in failure.message
    assert failure.reserved_nodes == [node] and failure.reserved_until == 1000.0 + evicting.EVICTION_PATIENCE
    assert book.decide_pod(step, 1001.0).evictions == []  # in flight: nothing asked again


def test_a_claim_named_as_the_waiting_pod_does_not_take_its_hold_first() -> None:
    """A Pod and a claim may share a name in a namespace (a claim placed alone is its own unit, keyed
    namespace/name): the Pod's eviction hold is not that claim's, so it goes elsewhere as any other."""
    book = book_over(TWO_NODES)
    scattered(book)
    assert book.submitted(claim("train-gpus", 8), needs_pod=True) is None
    assert book.decide_pod(book.pod_submitted(pod("train", "train-gpus"))).failures
    (node,) = {r.node for r in evicting.decide(book, "ml/train", 1000.0)}
    _, namesake = book.allocate(claim("train", 2))  # the claim ml/train, not the Pod ml/train
    assert namesake is not None and namesake.node != node


def test_once_the_evicted_claims_are_released_the_pod_fits_and_nothing_is_in_flight() -> None:
    book = book_over(TWO_NODES)
    scattered(book)
    waiting_big(book)
    requests = evicting.decide(book, "ml/big", 1000.0)
    for request in requests:  # the cluster deleted the Pods; their claims went
        assert book.deleted(request.key, request.uid) is not None
        book.release_stored(request.key)
    commits = store(book, AllocatePod("ml/big"))
    assert [c.node for c in commits] == [requests[0].node]
    book.evictions.settle(book, 1001.0)
    assert book.evictions.inflight == {} and book.evictions.note("pod:ml/big") == ""
    assert book.reservations.evicting == {} and book.reservations.others("") == 0  # nothing held any more


def test_only_claims_reserved_for_pods_are_evicted() -> None:
    book = book_over(TWO_NODES)
    scattered(book, pods=False)  # claims of their own (files, submit): moves.py re-places those in place
    waiting_big(book)
    assert evicting.decide(book, "ml/big", 1000.0) == []
    # A claim reserved for something other than a Pod is not evicted either.
    other = [ResourceClaimConsumerReference(api_group="example.com", resource="jobs", name="j", uid="u")]
    commit = next(iter(book.committed.values()))
    status = msgspec.structs.replace(commit.claim.status, reserved_for=other)
    assert evicting.pod_consumers(msgspec.structs.replace(commit.claim, status=status)) is None


def test_a_small_pod_or_one_that_fits_asks_for_nothing() -> None:
    book = book_over(TWO_NODES)
    scattered(book)
    assert book.submitted(claim("mid", 4), needs_pod=True) is None
    book.pod_submitted(pod("mid", "mid"))
    assert evicting.decide(book, "ml/mid", 1000.0) == []  # it fits (4 free on a node): no plan
    assert evicting.decide(book, "ml/nobody", 1000.0) == []


async def test_an_eviction_request_in_allocations_is_no_decision_for_a_successor(bus) -> None:
    await publish_fleet(bus, 2)
    leader = Allocator(bus)
    await leader.rebuild()
    c0, c1 = await submit(bus, leader, "c0"), await submit(bus, leader, "c1")

    def request(submitted: ev.ClaimSubmitted) -> ev.EvictionRequested:
        meta = submitted.claim.metadata
        pods = [ResourceClaimConsumerReference(resource="pods", name=f"p-{meta.name}", uid="u")]
        return ev.EvictionRequested(namespace="ml", name=meta.name, uid=meta.uid or "", pods=pods, for_namespace="ml", for_pod="big")

    await (await leader.fence.send_batch([request(c0)]))
    head = await leader.snapshots.write()  # the snapshot holds the two commits, not the request
    assert head is not None and head.decisions == 2
    await (await leader.fence.send_batch([request(c1)]))  # and one in the tail after it
    through_snapshot = await standby(bus)
    assert through_snapshot.snapshots.loaded_from == "snapshot"
    kv = await bus.key_value(fmt.BUCKET)
    await kv.delete(fmt.HEAD)
    full = await standby(bus)
    assert full.snapshots.loaded_from == "full"
    assert state(through_snapshot) == state(full) == state(leader)
    assert set(full.committed) == {"ml/c0", "ml/c1"}


def test_a_pod_with_several_claims_gets_room_for_them_together_on_one_node() -> None:
    """Two 4-GPU claims of one Pod (8 GPUs on one node; 4 free on each): the Pods on one node are asked
    to go, what the Pod's two claims would get there is held (all 8 GPUs of that node); once they are
    released the Pod is placed there. A Pod whose claims together are small asks for nothing."""
    book = book_over(TWO_NODES)
    on = scattered(book)
    for name in ("left", "right"):
        assert book.submitted(claim(name, 4), needs_pod=True) is None
    assert book.pod_submitted(pod("big", "left", "right")) == AllocatePod("ml/big")
    assert not book.decide_pod(AllocatePod("ml/big")).batch
    requests = evicting.decide(book, "ml/big", 1000.0)
    (node,) = {r.node for r in requests}
    assert sorted(r.key for r in requests) == sorted(on[node])
    assert book.reservations.per_node() == {node: 8} and sum(len(r.held) for r in requests) == 8
    for request in requests:
        book.deleted(request.key, request.uid)
        book.release_stored(request.key)
    assert {c.node for c in store(book, AllocatePod("ml/big"))} == {node}
    # Small together (two 1-GPU claims): they fit in holes as they come, nothing is evicted for them.
    small = [claim("one", 1), claim("two", 1)]
    assert not evicting.served(book.engine, small)
    assert evicting.served(book.engine, [claim("a", 4), claim("b", 4)])


def test_an_eviction_hold_is_shown_where_a_reservation_is() -> None:
    """The waiting Pod's failure names the node held for it and until when (`reservedNodes`,
    `reservedUntil`, the message: `dralloc get claims`), and the held devices count in the gauge."""
    book = book_over(TWO_NODES)
    scattered(book)
    waiting_big(book)
    assert book.reservations.per_node() == {}
    requests = evicting.decide(book, "ml/big", 1000.0)
    node = requests[0].node
    held = [d for r in requests for d in r.held]  # (shared out: each request a part, each device once)
    assert all(r.held and r.asked_at == 1000.0 for r in requests) and len(held) == len(set(held)) == 8
    (failure,) = book.decide_pod(AllocatePod("ml/big")).failures
    assert failure.reserved_nodes == [node] and failure.reserved_until == 1000.0 + evicting.EVICTION_PATIENCE
    assert f"{evicting.HELD_WORDS} node {node} held for it while they go" in failure.message
    assert "until 1970-01-01T00:21:40Z" in failure.message  # 1000 s + the patience
    assert book.reservations.per_node() == {node: 8}
    # Once over (the patience spent), nothing is held or shown.
    book.evictions.settle(book, 1000.0 + evicting.EVICTION_PATIENCE)
    assert book.evictions.shown("pod:ml/big") == ((), 0.0) and book.reservations.per_node() == {}


def test_a_replayed_request_is_held_again_until_its_own_end_and_never_longer() -> None:
    """`Evictions.replayed`: the devices named held again from the inventory; a request dated in the
    future counts from now; one of an older version (no askedAt, no devices) holds nothing."""
    book = book_over(TWO_NODES)
    scattered(book)
    waiting_big(book)
    requests = evicting.decide(book, "ml/big", 1000.0)
    devices = book.reservations.evicting["pod:ml/big"]
    fresh = book_over(TWO_NODES)
    scattered(fresh)
    waiting_big(fresh)
    fresh.evictions.replayed(fresh, requests, 1100.0)
    assert fresh.reservations.evicting["pod:ml/big"] == devices and fresh.evictions.inflight["pod:ml/big"].since == 1000.0
    future = [msgspec.structs.replace(r, asked_at=5000.0) for r in requests]
    fresh.evictions.replayed(fresh, future, 1200.0)
    assert fresh.evictions.inflight["pod:ml/big"].since == 1200.0
    old = [msgspec.structs.replace(r, asked_at=0.0, held=[]) for r in requests]
    fresh.evictions.replayed(fresh, old, 1300.0)
    assert fresh.evictions.inflight["pod:ml/big"].since == 1300.0 and "pod:ml/big" not in fresh.reservations.evicting


def refusal(request: ev.EvictionRequested, **changes: object) -> ev.EvictionRefused:
    """What the status writer tells when `request`'s Pod is not evicted (a budget refused)."""
    told = ev.EvictionRefused(
        namespace=request.namespace,
        name=request.name,
        uid=request.uid,
        pod=request.pods[0].name,
        for_namespace=request.for_namespace,
        for_pod=request.for_pod,
        asked_at=request.asked_at,
        message="Cannot evict pod as it would violate the pod's disruption budget.",
        gang=request.gang,
        for_claim=request.for_claim,
    )
    return msgspec.structs.replace(told, **changes)


def test_a_refusal_heard_lets_the_hold_go_says_why_and_asks_again_elsewhere_after_a_backoff() -> None:
    book = book_over(TWO_NODES)
    scattered(book)
    waiting_big(book)
    first = evicting.decide(book, "ml/big", 1000.0)
    node = first[0].node
    # Not news: another asking, another claim's uid, another Pod, a Pod with nothing in flight.
    for stale in (refusal(first[0], asked_at=999.0), refusal(first[0], uid="other"), refusal(first[0], for_pod="nobody")):
        assert not book.evictions.refusal(book, stale, 1001.0)
    assert book.reservations.per_node() == {node: 8}
    assert book.evictions.refusal(book, refusal(first[0]), 1001.0)
    assert not book.evictions.refusal(book, refusal(first[0]), 1002.0)  # told again: nothing new
    # The hold is let go at once, and the failure says who refused, why, and when it asks again.
    assert book.reservations.evicting == {} and book.reservations.per_node() == {}
    (failure,) = book.decide_pod(AllocatePod("ml/big")).failures
    assert failure.reserved_nodes == [] and failure.reserved_until == 0.0
    assert f"Pod ml/{first[0].pods[0].name} (claim {first[0].key}): Cannot evict pod" in failure.message
    assert "asks again after 1970-01-01T00:17:41Z" in failure.message  # 1001 s + REFUSED_BACKOFF
    # Not asked again during the backoff; after it, around the claim refused: the other node is emptied.
    assert evicting.decide(book, "ml/big", 1001.0 + evicting.REFUSED_BACKOFF - 1) == []
    second = evicting.decide(book, "ml/big", 1001.0 + evicting.REFUSED_BACKOFF)
    assert second and {r.node for r in second} != {node} and first[0].key not in {r.key for r in second}
    assert {r.refused_before for r in first} == {0} and {r.refused_before for r in second} == {1}  # (for a successor)
    # Refused again: the backoff doubles.
    now = 1001.0 + evicting.REFUSED_BACKOFF + 1
    assert book.evictions.refusal(book, refusal(second[0]), now)
    assert book.evictions.inflight["pod:ml/big"].retry_at == now + 2 * evicting.REFUSED_BACKOFF
    # However many in a row, the backoff is the patience at most (and never a float overflow).
    assert evicting.backoff(4) == evicting.EVICTION_PATIENCE == evicting.backoff(5000)


def test_a_pod_tied_to_a_node_by_its_shared_claim_gets_room_made_on_that_node() -> None:
    """The Pod ml/big uses ml/shared (2 GPUs, placed on node X for another Pod) and a 6-GPU claim of its
    own: it can run only on X, which holds two 2-GPU Pods' claims beside the shared one. Those two are
    asked to go (they fit on the other node), not the other node's (which has more room but would not
    do: the shared claim stays on X); X's other six GPUs are held for it; once they go it is placed there."""
    book = book_over(TWO_NODES)
    assert book.submitted(claim("shared", 2), needs_pod=True) is None
    (shared,) = store(book, book.pod_submitted(pod("sharer", "shared")))
    x = shared.node or ""
    on: dict[str, list[str]] = {}
    for i in range(7):
        assert book.submitted(claim(f"s{i}", 2), needs_pod=True) is None
        (commit,) = store(book, book.pod_submitted(pod(f"s{i}", f"s{i}")))
        on.setdefault(commit.node or "", []).append(commit.key)
    (y,) = [n for n in on if n != x]
    for key in [*on[x][:1], *on[y][:2]]:  # X: the shared claim and two small ones (2 free); Y: two small (4 free)
        assert book.deleted(key, "") is not None
        book.release_stored(key)
        book.pod_deleted(key, "")
    in_way = on[x][1:]
    assert book.submitted(claim("own", 6), needs_pod=True) is None
    step = book.pod_submitted(pod("big", "shared", "own"))
    assert step == AllocatePod("ml/big")
    plan = book.decide_pod(step, 1000.0)
    assert not plan.batch and plan.failures
    assert sorted(r.key for r in plan.evictions) == sorted(in_way) and {r.node for r in plan.evictions} == {x}
    assert all(r.for_pod == "big" for r in plan.evictions) and sum(len(r.held) for r in plan.evictions) == 6
    assert book.reservations.per_node() == {x: 6}
    for key in in_way:
        assert book.deleted(key, "") is not None
        book.release_stored(key)
    placed = book.decide_pod(AllocatePod("ml/big"), 1001.0)
    assert [(e.key, e.node) for e in placed.batch] == [("ml/own", x)]


def test_a_placed_claim_of_another_kind_does_not_make_a_pod_large() -> None:
    """The Pod ml/big uses ml/links (4 NICs, placed on node X for another Pod) and a 4-GPU claim of its
    own that does not fit beside X's three 2-GPU Pods: 8 devices, but half a node of GPUs, a unit that
    fits in holes as they come, so nothing is evicted for it. A placed claim of GPUs counts (4 + 4 of 8)."""
    book = book_over(TWO_NODES)
    nic = msgspec.convert({"metadata": {"name": "nic"}, "spec": {"selectors": [{"cel": {"expression": "device.driver == 'dra.net'"}}]}}, DeviceClass)
    assert book.apply_inventory(ev.DeviceClassPublished(device_class=nic)) is None
    links = claim("links", 4)
    links.spec.devices.requests[0].exactly.device_class_name = "nic"  # type: ignore[union-attr]
    assert book.submitted(links, needs_pod=True) is None
    (shared,) = store(book, book.pod_submitted(pod("sharer", "links")))
    x = shared.node or ""
    for i in range(3):  # (best fit: all on X, 2 GPUs left free there)
        assert book.submitted(claim(f"s{i}", 2), needs_pod=True) is None
        assert [c.node for c in store(book, book.pod_submitted(pod(f"s{i}", f"s{i}")))] == [x]
    assert book.engine.placement.kinds.free[device_kind("gpu.nvidia.com", "gpu")][x] == 2
    assert book.submitted(claim("own", 4), needs_pod=True) is None
    step = book.pod_submitted(pod("big", "links", "own"))
    assert step == AllocatePod("ml/big")
    plan = book.decide_pod(step, 1000.0)
    assert plan.batch == [] and plan.failures and plan.evictions == []
    assert not evicting.served(book.engine, [book.unused["ml/own"]], [book.committed["ml/links"].claim])
    gpus = book.committed["ml/s0"].claim  # 2 GPUs placed: 6 of 8, still not whole
    assert not evicting.served(book.engine, [book.unused["ml/own"]], [gpus])
    assert evicting.served(book.engine, [claim("six", 6)], [gpus])


def test_what_a_pod_placed_elsewhere_held_ends_at_the_next_reservation_round() -> None:
    book = book_over(TWO_NODES)
    scattered(book)
    waiting_big(book)
    assert evicting.decide(book, "ml/big", 1000.0)
    book.pod_deleted("ml/big", "")  # gone (or placed) while its evictions ran
    book.reserve_waiting(1001.0)
    assert book.evictions.inflight == {} and book.reservations.evicting == {}


async def asking_leader(bus) -> tuple[Allocator, Callable[[ev.Event], Awaitable[None]], dict[str, list[ev.ClaimSubmitted]]]:
    """A leader (moves on) over two 8-GPU nodes, each with two 2-GPU Pods' claims left on it, that asked
    for the eviction of one node's two Pods for the 8-GPU Pod ml/big: the leader, how it takes an event
    (published, then decided), and node -> the Pods' claims left there."""
    await publish_fleet(bus, 2)
    leader = Allocator(bus, moves="early")
    await leader.rebuild()

    async def take(event: ev.Event) -> None:
        await bus.publish(event)
        await leader.on_claim(event)

    async def pod_with(name: str, gpus: int) -> ev.ClaimSubmitted:
        submitted = ev.ClaimSubmitted(claim=claim_event(name, gpus).claim, needs_pod=True)
        await take(submitted)
        await take(ev.PodSubmitted(namespace="ml", name=name, uid=f"uid-{name}", claims=[name]))
        return submitted

    small = [await pod_with(f"s{i}", 2) for i in range(8)]
    on: dict[str, list[ev.ClaimSubmitted]] = {}
    for submitted in small:
        on.setdefault(leader.committed[submitted.claim.key].node or "", []).append(submitted)
    for gone in [s for kept in on.values() for s in kept[:2]]:  # two leave each node: 4 GPUs free on each
        meta = gone.claim.metadata
        await take(ev.ClaimDeleted(namespace="ml", name=meta.name, uid=meta.uid or ""))
        await take(ev.PodDeleted(namespace="ml", name=meta.name, uid=f"uid-{meta.name}"))
    await pod_with("big", 8)
    return leader, take, {node: kept[2:] for node, kept in on.items()}


async def test_a_successor_keeps_the_evictions_an_earlier_term_asked_for_in_flight(bus) -> None:
    """The leader (moves on) asks for two Pods' eviction for a large Pod; a successor reads the requests
    back from ALLOCATIONS and asks for nothing more while they are in flight (moves off: it reads none)."""
    leader, _, on = await asking_leader(bus)
    asked = leader.book.evictions.inflight["pod:ml/big"]
    assert len(asked.claims) == 2 and {k for k in asked.claims} == {s.claim.key for s in on[asked.node]}

    assert asked.devices and leader.book.reservations.evicting["pod:ml/big"] == asked.devices

    successor = Allocator(bus, moves="early")
    await successor.rebuild()
    found = successor.book.evictions.inflight["pod:ml/big"]
    assert found.claims == asked.claims and found.node == asked.node and found.note == asked.note
    assert found.since == asked.since  # the same patience, not a new one from the takeover
    assert evicting.decide(successor.book, "ml/big", time.time()) == []  # in flight: nothing asked again
    # What the leader held for the Pod is held again (the same devices, shown as the leader showed them).
    assert successor.book.reservations.evicting["pod:ml/big"] == asked.devices
    assert successor.book.reservations.per_node() == leader.book.reservations.per_node() == {asked.node: 8}
    assert successor.book.evictions.shown("pod:ml/big") == ((asked.node,), asked.since + evicting.EVICTION_PATIENCE)
    without = Allocator(bus)
    await without.rebuild()
    assert without.book.evictions.inflight == {}


async def test_a_refusal_heard_before_a_takeover_stands_for_the_successor_and_then_expires(bus) -> None:
    """An EvictionRefused the leader heard (and acked: the durable consumer does not hand it to a
    successor) is replayed from CLAIMS at the rebuild: the successor holds nothing for the refused
    asking and asks again after the same backoff, from when it was refused. The refusal carries a TTL
    (`REFUSAL_TTL_S`, longer than the patience) and expires: CLAIMS does not keep one per claim for good."""
    leader, take, _ = await asking_leader(bus)
    asked = leader.book.evictions.inflight["pod:ml/big"]
    key, uid = next(iter(asked.claims.items()))
    name = key.split("/", 1)[1]
    told = ev.EvictionRefused(
        namespace="ml", name=name, uid=uid, pod=name, for_namespace="ml", for_pod="big", asked_at=asked.asked_at,
        message="Cannot evict pod as it would violate the pod's disruption budget.", refused_at=asked.asked_at,
    )  # fmt: skip
    await take(told)
    heard = leader.book.evictions.inflight["pod:ml/big"]
    assert heard.retry_at == asked.asked_at + evicting.REFUSED_BACKOFF and leader.book.reservations.evicting == {}

    successor = Allocator(bus, moves="early")
    await successor.rebuild()
    found = successor.book.evictions.inflight["pod:ml/big"]
    assert found.refused == heard.refused and found.retry_at == heard.retry_at and found.note == heard.note
    assert successor.book.reservations.evicting == {} and successor.book.reservations.per_node() == {}
    assert successor.book.evictions.refused_claims == leader.book.evictions.refused_claims == {key: asked.asked_at + evicting.EVICTION_PATIENCE}

    stored = await bus.last_message("CLAIMS", told.subject)
    assert stored is not None and stored.headers["Nats-TTL"] == f"{round(REFUSAL_TTL_S)}s" and REFUSAL_TTL_S >= evicting.EVICTION_PATIENCE
    bus.refusal_ttl = 1.0
    await bus.publish(msgspec.structs.replace(told, pod="another"))
    async with asyncio.timeout(15):
        while await bus.last_message("CLAIMS", told.subject) is not None:
            await asyncio.sleep(0.2)  # until it expires


def refused_by_budget(asked: evicting.InFlight) -> ev.EvictionRefused:
    """The status writer's refusal of the first Pod `asked` named, refused when it was asked."""
    key, uid = next(iter(asked.claims.items()))
    name = key.split("/", 1)[1]
    return ev.EvictionRefused(
        namespace="ml", name=name, uid=uid, pod=name, for_namespace="ml", for_pod="big", asked_at=asked.asked_at,
        message="Cannot evict pod as it would violate the pod's disruption budget.", refused_at=asked.asked_at,
    )  # fmt: skip


async def test_a_successor_doubles_the_backoff_as_often_as_the_leader_did(bus, monkeypatch) -> None:
    """Refused twice in a row, the leader waits twice the backoff before asking a third time; a successor
    that replays the second asking (``refusedBefore`` 1) and its refusal waits as long, not the first
    refusal's backoff again."""
    monkeypatch.setattr(evicting, "REFUSED_BACKOFF", 0.5)
    leader, take, _ = await asking_leader(bus)
    await take(refused_by_budget(leader.book.evictions.inflight["pod:ml/big"]))
    first = leader.book.evictions.inflight["pod:ml/big"]
    async with asyncio.timeout(10):
        while time.time() < first.retry_at:
            await asyncio.sleep(0.05)
    await leader.decide_step(leader.book.pod_submitted(leader.book.pods["ml/big"]))  # the backoff is over: asked again
    second = leader.book.evictions.inflight["pod:ml/big"]
    assert second.asked_at > first.asked_at and not second.refused and second.node != first.node
    await take(refused_by_budget(second))
    assert second.retry_at == second.asked_at + 2 * evicting.REFUSED_BACKOFF and leader.book.evictions.refusals == {"pod:ml/big": 2}

    successor = Allocator(bus, moves="early")
    await successor.rebuild()
    found = successor.book.evictions.inflight["pod:ml/big"]
    assert found.asked_at == second.asked_at and found.retry_at == second.retry_at and found.note == second.note
    assert successor.book.evictions.refusals == {"pod:ml/big": 2}


async def test_a_row_of_refusals_lapses_for_the_leader_as_its_refusals_expire_for_a_successor(bus, monkeypatch) -> None:
    """The leader counts a refusal; once it has expired from CLAIMS (the TTL) a successor, which reads the
    asking back but not the refusal, counts none: so the leader's row lapses as long after its last
    asking (`REFUSALS_LAPSE`, the TTL), and both ask next with ``refusedBefore`` 0, backing off as
    little. (Times scaled down from 60 s backoff, 300 s patience, 600 s TTL.)"""
    assert evicting.REFUSALS_LAPSE == REFUSAL_TTL_S
    for name, seconds in (("REFUSED_BACKOFF", 0.25), ("EVICTION_PATIENCE", 0.5), ("REFUSALS_LAPSE", 1.0)):
        monkeypatch.setattr(evicting, name, seconds)
    bus.refusal_ttl = 1.0
    leader, take, _ = await asking_leader(bus)
    told = refused_by_budget(leader.book.evictions.inflight["pod:ml/big"])
    await take(told)
    assert leader.book.evictions.refusals == {"pod:ml/big": 1}
    async with asyncio.timeout(15):
        while await bus.last_message("CLAIMS", told.subject) is not None:
            await asyncio.sleep(0.1)  # until the refusal expires
    successor = Allocator(bus, moves="early")
    await successor.rebuild()
    now = time.time()
    for book in (leader.book, successor.book):
        book.evictions.settle(book, now)
        assert book.evictions.refusals == {} and book.evictions.inflight == {}
        (request, *_) = evicting.decide(book, "ml/big", now)  # asked again, a new row
        assert request.refused_before == 0


THREE_NODES = [{"profile": "h100-sxm", "count": 3, "prefix": "n"}]  # 8 GPUs each


def gang_claim(name: str, gang: str, size: int, gpus: int) -> ResourceClaim:
    """A member of the gang ml/`gang` of `size` (any nodes: domain "")."""
    return claim(name, gpus, {"dralloc.dev/gang": gang, "dralloc.dev/gang-size": str(size), "dralloc.dev/gang-domain": ""})


def gang_of_pods(book: Decisions, size: int = 2, gpus: int = 8) -> GangComplete:
    """`size` Pods, each with a `gpus`-GPU claim of the gang ml/job, submitted: the gang is complete."""
    step = None
    for i in range(size):
        assert book.submitted(gang_claim(f"g{i}", "job", size, gpus), needs_pod=True) is None
        step = book.pod_submitted(pod(f"g{i}", f"g{i}"))
    assert isinstance(step, GangComplete)
    return step


async def test_an_eviction_batch_the_bus_cannot_store_is_a_refusal_and_the_term_goes_on(bus, monkeypatch) -> None:
    """A batch of requests the bus refuses before sending (`PublishRefused`: here over a batch limit of
    one message) lets the hold go and backs off as a refusal; the term is not ended (its successor
    would plan the same batch again) and the allocator goes on deciding."""
    monkeypatch.setattr(bus_client, "MAX_BATCH", 1)  # (the Pods' one-claim commits still fit)
    leader, take, on = await asking_leader(bus)
    found = leader.book.evictions.inflight["pod:ml/big"]
    assert not leader.term.is_set() and leader.book.reservations.evicting == {} and found.devices == 0
    assert found.retry_at > found.asked_at and leader.book.evictions.refusals == {"pod:ml/big": 1}
    assert "could not ask: an atomic batch holds 1 to 1 events, not 2" in found.note
    assert evicting.decide(leader.book, "ml/big", found.asked_at + 1) == []  # not asked again before the backoff
    asked = [f"dra.allocations.ml.{s.claim.metadata.name}.evict" for kept in on.values() for s in kept]
    assert [await bus.last_message("ALLOCATIONS", subject) for subject in asked] == [None] * 4  # nothing sent
    extra = ev.ClaimSubmitted(claim=claim_event("after", 1).claim)
    await take(extra)
    assert leader.committed[extra.claim.key].node  # the term decides on


def test_a_gang_of_pods_that_does_not_fit_asks_for_the_pods_in_its_way_and_takes_their_nodes() -> None:
    """Two 8-GPU Pods of one gang over three 8-GPU nodes holding 2-GPU Pods' claims (one on each of two
    nodes, two on the third: no node whole): the Pods on the two nodes with one each are asked to go
    (their claims fit on the third), the gang's two nodes held; its members' failures say so; once the
    claims are released the gang takes those nodes. A gang of claims of their own asks for nothing."""
    book = book_over(THREE_NODES)
    on: dict[str, list[str]] = {}
    for i in range(12):
        assert book.submitted(claim(f"s{i}", 2), needs_pod=True) is None
        (commit,) = store(book, book.pod_submitted(pod(f"s{i}", f"s{i}")))
        on.setdefault(commit.node or "", []).append(commit.key)
    kept = dict(zip(sorted(on), (1, 1, 2)))
    for node, keys in on.items():
        for key in keys[kept[node] :]:
            assert book.deleted(key, "") is not None
            book.release_stored(key)
            book.pod_deleted(key, "")
        on[node] = keys[: kept[node]]
    complete = gang_of_pods(book)
    assert book.decide_gang(complete).evictions == []  # moves off
    plan = book.decide_gang(complete, 1000.0)
    assert plan.unplaced and not plan.batch
    emptied = sorted(n for n in on if len(on[n]) == 1)
    assert sorted(r.key for r in plan.evictions) == sorted(k for n in emptied for k in on[n])
    for request in plan.evictions:
        assert (request.for_namespace, request.for_pod, request.gang, request.asked_at) == ("ml", "g0", "job", 1000.0)
        assert request.gang_pods == ["g0", "g1"]  # (each member's Pod is told of a refusal)
        assert request.node == ", ".join(emptied) and len(request.held) == 8  # (half the gang's 16 each)
        assert request.pods == [ResourceClaimConsumerReference(resource="pods", name=request.name, uid=f"uid-{request.name}")]
        assert evicting.unit_of(request) == "gang:ml/job"
    assert book.reservations.per_node() == {n: 8 for n in emptied}
    for member, outcome in plan.unplaced:
        failure = book.failure(member, outcome.status, outcome.message)
        assert failure is not None and "dralloc asked to evict Pod(s)" in failure.message and failure.pod == member.metadata.name
        assert failure.reserved_nodes == emptied and failure.reserved_until == 1000.0 + evicting.EVICTION_PATIENCE
    assert book.decide_gang(complete, 1001.0).evictions == []  # in flight: nothing asked again
    # A refusal names the gang: the hold is let go.
    assert book.evictions.refusal(book, refusal(plan.evictions[0], refused_at=1001.0), 1002.0)
    assert book.reservations.per_node() == {} and book.evictions.inflight["gang:ml/job"].retry_at == 1001.0 + evicting.REFUSED_BACKOFF
    assert not book.evictions.refusal(book, refusal(plan.evictions[1], gang=""), 1002.0)  # not the gang's: no news
    # Asked again after the backoff (around the claim refused: no other plan), or, with the claims gone, placed.
    for request in plan.evictions:
        assert book.deleted(request.key, request.uid) is not None
        book.release_stored(request.key)
    placed = book.decide_gang(complete, 1100.0)
    assert placed.placed and sorted(e.node or "" for e in placed.batch if isinstance(e, ev.AllocationCommitted)) == emptied
    book.batch_stored(placed)
    book.evictions.settle(book, 1101.0)
    assert book.evictions.inflight == {} and book.reservations.evicting == {}


def test_a_large_gangs_eviction_batch_holds_each_device_once() -> None:
    """A gang of 100 8-GPU Pods over 94 whole nodes and 6 holding seven 1-GPU Pods each (room for those
    on 7 more nodes): 42 requests, 800 devices held. Shared out, each device is carried once (every
    request carrying all 800 made a batch of ~2 MB; at 500 members ~50-90 MB, each message near the
    bus's 1 MB limit); the batch is well under 1 MB, and a successor replaying it holds all 800."""
    whole, busy, small = 94, 6, 7
    room = -(-busy * small // 7) + 1
    fleet = [{"profile": "h100-sxm", "count": whole + busy + room, "prefix": "n"}]

    def layout(book: Decisions) -> GangComplete:
        on: dict[str, list[str]] = {}
        for i in range(len(book.engine.inventory.node_names) * 8):  # every node full of 1-GPU Pods
            assert book.submitted(claim(f"s{i}", 1), needs_pod=True) is None
            (commit,) = store(book, book.pod_submitted(pod(f"s{i}", f"s{i}")))
            on.setdefault(commit.node or "", []).append(commit.key)

        def drop(key: str) -> None:
            assert book.deleted(key, "") is not None
            book.release_stored(key)
            book.pod_deleted(key, "")

        names = sorted(on)
        for j, node in enumerate(names[whole + busy :]):  # room: one claim of its own (never evicted), 7 GPUs free
            for key in on[node][1:]:
                drop(key)
            _, own = book.allocate(claim(f"own{j}", 1))
            assert own is not None and own.node == node
            book.commit_written(own)
            for i in range(6):  # (full again meanwhile: the next claim of its own goes to the next room node)
                assert book.submitted(claim(f"t{j}-{i}", 1), needs_pod=True) is None
                on[node] += [c.key for c in store(book, book.pod_submitted(pod(f"t{j}-{i}", f"t{j}-{i}")))]
        for node in names[whole + busy :]:
            for key in [on[node][0], *on[node][8:]]:
                drop(key)
        for node in names[:whole]:
            for key in on[node]:
                drop(key)
        for node in names[whole : whole + busy]:
            for key in on[node][small:]:
                drop(key)
        return gang_of_pods(book, whole + busy)

    book = book_over(fleet, max_gang=500)
    plan = book.decide_gang(layout(book), 1000.0)
    requests = plan.evictions
    assert len(requests) == busy * small and all(len(r.gang_pods) == whole + busy for r in requests)
    held = [d for r in requests for d in r.held]
    assert len(held) == len(set(held)) == 8 * (whole + busy) and max(len(r.held) for r in requests) == 20  # (800 / 42)
    assert sum(len(ev.encode(r)) for r in requests) < 1 << 20
    successor = book_over(fleet, max_gang=500)
    layout(successor)
    successor.evictions.replayed(successor, requests, 1001.0)
    assert successor.reservations.evicting["gang:ml/job"] == book.reservations.evicting["gang:ml/job"]
    assert sum(successor.reservations.per_node().values()) == 800


def test_a_gang_of_claims_of_their_own_asks_for_no_eviction() -> None:
    book = book_over(TWO_NODES)
    scattered(book)
    complete = None
    for i in range(2):
        complete = book.submitted(gang_claim(f"g{i}", "job", 2, 8))
    assert isinstance(complete, GangComplete)
    plan = book.decide_gang(complete, 1000.0)
    assert plan.unplaced and plan.evictions == [] and book.evictions.inflight == {}


def test_a_claim_of_its_own_that_no_move_in_place_helps_asks_for_the_pods_in_its_way() -> None:
    """An 8-GPU claim from a file or `submit` (no Pod) over two 8-GPU nodes holding two 2-GPU Pods'
    claims each: no claim of its own to move in place, so the Pods on one node are asked to go (their
    claims fit on the other), the request names the claim (``forClaim``; no Pod), its failure tells of
    it and shows the node held, and once the Pods' claims are released the claim takes that node."""
    book = book_over(TWO_NODES)
    on = scattered(book)
    big = claim("big", 8)
    outcome, commit = book.allocate(big)
    assert commit is None and outcome.status == "unsatisfiable"
    (unit,) = moving.due(book, "early", 1000.0)
    assert moving.decide(book, unit) is None  # nothing of its own in the way
    requests = evicting.decide_unit(book, unit, 1000.0)
    (node,) = {r.node for r in requests}
    assert sorted(r.key for r in requests) == sorted(on[node])
    for request in requests:
        assert (request.for_namespace, request.for_pod, request.for_claim, request.gang) == ("ml", "", "big", "")
        assert evicting.unit_of(request) == "ml/big" and ev.decode(ev.encode(request)) == request
        assert request.message.startswith(f"claim ml/big waits for room on node {node}")
    failure = book.failure(big, "unsatisfiable", book.messages["ml/big"])
    assert failure is not None and "dralloc asked to evict Pod(s)" in failure.message and "see this Pod's Events" not in failure.message
    assert failure.reserved_nodes == [node] and failure.pod == ""
    assert evicting.decide_unit(book, unit, 1001.0) == []  # in flight
    # Forged or stale refusals change nothing: another asking, another claim, a Pod of that name, a gang.
    for forged in (
        refusal(requests[0], asked_at=999.0),
        refusal(requests[0], for_claim="other"),
        refusal(requests[0], for_claim="", for_pod="big"),
        refusal(requests[0], gang="big"),
    ):
        assert not book.evictions.refusal(book, forged, 1001.0)
    assert book.reservations.per_node() == {node: 8}
    _, newcomer = book.allocate(claim("newcomer", 2))  # the hold: a newcomer goes to the other node
    assert newcomer is not None and newcomer.node != node
    book.commit_written(newcomer)
    for request in requests:
        assert book.deleted(request.key, request.uid) is not None
        book.release_stored(request.key)
    _, placed = book.allocate(big)
    assert placed is not None and placed.node == node
    book.commit_written(placed)
    book.evictions.settle(book, 1002.0)
    assert book.evictions.inflight == {} and book.reservations.evicting == {}


def test_a_successor_keeps_a_gang_or_a_claim_in_flight_by_its_unit() -> None:
    """`Evictions.replayed`: requests for a gang (``gang``) and for a claim of its own (``forClaim``) are
    in flight again under their unit, holding the same devices, and a refusal replayed after them answers
    that unit only."""
    book = book_over(TWO_NODES)
    scattered(book)
    big = claim("big", 8)
    book.allocate(big)
    (unit,) = moving.due(book, "early", 1000.0)
    requests = evicting.decide_unit(book, unit, 1000.0)
    devices = book.reservations.evicting["ml/big"]
    fresh = book_over(TWO_NODES)
    scattered(fresh)
    fresh.allocate(big)
    as_gang = [msgspec.structs.replace(r, for_claim="", for_pod="g0", gang="job") for r in requests]
    fresh.evictions.replayed(fresh, [*requests, *as_gang], 1100.0, [refusal(as_gang[0], refused_at=1001.0)])
    assert set(fresh.evictions.inflight) == {"ml/big", "gang:ml/job"}
    assert fresh.reservations.evicting == {"ml/big": devices}  # (the gang's hold let go: refused)
    assert fresh.evictions.inflight["gang:ml/job"].refused and not fresh.evictions.inflight["ml/big"].refused


def test_unit_keys_of_pods_gangs_and_claims_are_told_apart() -> None:
    """`reservations.pod_unit`/`gang_unit` and a claim's own key: each unit's key says what it is (a
    namespace has no colon, so a claim's key is never taken for a Pod's or a gang's), and a gang
    member's unit (`claims.unit_key`) is the unit its evictions are kept under (`evicting.unit_of`)."""
    assert reservations.unit_parts(reservations.pod_unit("ml/a")) == ("pod", "ml/a")
    assert reservations.unit_parts(reservations.gang_unit("ml/a")) == ("gang", "ml/a")
    assert reservations.unit_parts("ml/a") == ("claim", "ml/a")
    member = gang_claim("g0", "job", 2, 4)
    request = ev.EvictionRequested(namespace="ml", name="s0", uid="u", pods=[], for_namespace="ml", for_pod="g0", gang="job")
    assert unit_key(member) == evicting.unit_of(request) == "gang:ml/job"
