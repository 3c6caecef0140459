"""A gang's commit against a real nats-server, cut part way: ALLOCATIONS holds the whole gang or
none of it, and the next term leaves every member with one outcome, all inside one domain.

Mostly in one process, so the cut falls exactly where the test puts it: a foreign write (a
deposed leader's late decision) lands on the stream between the gang's first member and the
rest. Streams written by an older allocator, which committed a gang member by member, are
rebuilt into a whole gang (completed in its domain, or given back and decided again as a
whole). The last test runs the services as processes: the bus refuses every write after one
(ALLOCATIONS full), the allocator is killed with SIGKILL, the bus recovers, a new one starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import msgspec
import pytest
from opentelemetry import trace
from pipeline import Stack

from dralloc import telemetry
from dralloc.allocator.engine.gang import allocate_gang
from dralloc.allocator.service import Allocator, Fenced
from dralloc.bus import STREAMS, ApiError, Bus, embedded_nats
from dralloc.bus.raw import DiscardPolicy, connection, jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim, ResourceClaimStatus

# Two NVLink cliques (GB200 NVL72 racks), each of two trays of 4 GPUs: a-0, a-1 | b-0, b-1.
FLEET = [{"profile": "gb200-nvl72", "count": 2, "prefix": "a"}, {"profile": "gb200-nvl72", "count": 2, "prefix": "b"}]
NAMESPACE = "ml"


@pytest.fixture
def fleet() -> list[dict]:
    return FLEET  # for the fault tests' `bus` (conftest.py)


def claim(name: str, gpus: int, annotations: dict[str, str] | None = None) -> ResourceClaim:
    return msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4()), "generation": 1, "annotations": annotations or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )  # fmt: skip


def gang(name: str, size: int, gpus: int = 4, domain: str | None = None) -> list[ResourceClaim]:
    marks = {"dralloc.dev/gang": name, "dralloc.dev/gang-size": str(size)}
    if domain is not None:
        marks["dralloc.dev/gang-domain"] = domain
    return [claim(f"{name}-{i}", gpus, marks) for i in range(size)]


async def stored(bus: Bus) -> list[tuple[ev.Event, dict[str, str]]]:
    last = (await bus.stream_state("ALLOCATIONS")).last_sequence
    found = []
    for seq in range(1, last + 1):
        msg = await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)
        found.append((ev.decode(msg.data), dict(msg.headers or {})))
    return found


async def decide_waiting(allocator: Allocator) -> None:
    """What a term does first after its rebuild: try every claim left waiting."""
    async with allocator.lock:
        for waiting in list(allocator.waiting.values()):
            await allocator.retry(waiting)


def outcomes(found: list[tuple[ev.Event, dict[str, str]]], keys: set[str]) -> dict[str, list[ev.Event]]:
    by_key: dict[str, list[ev.Event]] = {k: [] for k in keys}
    for event, _ in found:
        if isinstance(event, ev.AllocationCommitted | ev.AllocationFailed) and event.key in keys:
            by_key[event.key].append(event)
    return by_key


def holders(found: list[tuple[ev.Event, dict[str, str]]]) -> dict[tuple[str, str], str]:
    """Device -> the claim holding it at the stream's end; asserts no device is committed twice."""
    held: dict[tuple[str, str], str] = {}
    for event, _ in found:
        if isinstance(event, ev.AllocationCommitted):
            for r in event.allocation.devices.results:
                assert held.setdefault((r.pool, r.device), event.key) == event.key, f"{r.device} given twice"
        elif isinstance(event, ev.AllocationReleased):
            held = {d: k for d, k in held.items() if k != event.key}
    return held


def cliques(allocator: Allocator) -> dict[str, str]:
    return allocator.engine.placement.topology.domains(None)[0]


def intrude_after_first(bus: Bus, subject: str, intruder: ev.Event) -> None:
    """Right after the first message to `subject` leaves, a foreign decision is stored (on the same
    connection, so exactly between it and the messages after it): a deposed leader's late write."""
    original = connection(bus).publish
    done = False

    async def publish(subj: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None) -> None:
        nonlocal done
        await original(subj, payload, reply=reply, headers=headers)
        if subj == subject and not done:
            done = True
            await original(intruder.subject, ev.encode(intruder), headers={"Nats-Msg-Id": "intruder"})

    connection(bus).publish = publish  # type: ignore[method-assign]


async def test_a_gang_commit_cut_by_a_foreign_write_stores_no_member_and_the_next_term_commits_it_whole(bus: Bus):
    members = gang("train", 2)
    for member in members:
        await bus.publish(ev.ClaimSubmitted(claim=member))
    keys = {m.key for m in members}
    first = Allocator(bus)
    await first.rebuild()
    intruder = ev.AllocationFailed(namespace="other", name="late", uid="u", generation=1, reason="unsatisfiable", message="a deposed leader")
    intrude_after_first(bus, ev.AllocationReleased(namespace=NAMESPACE, name="train-0", uid="").subject, intruder)

    await first.on_claim(ev.ClaimSubmitted(claim=members[0]))  # collected: waits for its gang
    with pytest.raises(Fenced):
        await first.on_claim(ev.ClaimSubmitted(claim=members[1]))
    assert first.term.is_set()
    found = await stored(bus)
    assert [e for e, _ in found] == [intruder]  # no member without the other
    assert all(not first.engine.ledger.claims.get(k) for k in keys)

    successor = Allocator(bus)
    await successor.rebuild()
    await decide_waiting(successor)
    found = await stored(bus)
    by_key = outcomes(found, keys)
    assert all(len(o) == 1 and isinstance(o[0], ev.AllocationCommitted) for o in by_key.values()), by_key
    assert len({cliques(successor)[o[0].node] for o in by_key.values()}) == 1  # one NVLink clique
    assert set(holders(found).values()) == keys
    batches = {h.get("Nats-Batch-Id") for e, h in found if isinstance(e, ev.AllocationCommitted)}
    assert len(batches) == 1 and None not in batches  # written as one atomic batch


async def test_each_members_commit_continues_that_members_own_trace(bus: Bus):
    telemetry.setup("test")
    members = gang("train", 2)
    allocator = Allocator(bus)
    await allocator.rebuild()
    traces = {}
    for member in members:  # each arrives in its own trace (the ingestor's, through the consumer)
        with telemetry.tracer().start_as_current_span(f"process {member.key}") as span:
            traces[member.key] = span.get_span_context().trace_id
            await allocator.on_claim(ev.ClaimSubmitted(claim=member))
    found = await stored(bus)
    assert len(found) == 2
    for event, headers in found:
        assert trace.get_current_span(telemetry.extract(headers)).get_span_context().trace_id == traces[event.key]


async def partly_committed(bus: Bus, members: list[ResourceClaim]) -> dict[str, str]:
    """ALLOCATIONS as an older allocator left it when it died inside a gang's commit: the gang
    decided whole, only its first member's commit stored. Returns the clique of each node."""
    for member in members:
        await bus.publish(ev.ClaimSubmitted(claim=member))
    old = Allocator(bus)
    await old.rebuild()
    outcome = allocate_gang(old.engine, members, name=f"{NAMESPACE}/train")[0]
    assert outcome.status == "allocated"
    decided = msgspec.structs.replace(members[0], status=ResourceClaimStatus(allocation=outcome.allocation))
    await bus.publish(ev.AllocationCommitted(claim=decided, node=outcome.node))
    return cliques(old)


async def test_rebuild_completes_a_partly_committed_gang_inside_its_clique(bus: Bus):
    members = gang("train", 3, gpus=2)  # 6 GPUs: only inside one clique of 8
    clique_of = await partly_committed(bus, members)
    (first,) = [e for e, _ in await stored(bus)]
    successor = Allocator(bus)
    await successor.rebuild()
    await decide_waiting(successor)

    found = await stored(bus)
    keys = {m.key for m in members}
    by_key = outcomes(found, keys)
    assert all(len(o) == 1 and isinstance(o[0], ev.AllocationCommitted) for o in by_key.values()), by_key
    assert by_key[members[0].key] == [first]  # the member already committed keeps its devices
    assert {clique_of[o[0].node] for o in by_key.values()} == {clique_of[first.node]}
    assert set(holders(found).values()) == keys
    assert not successor.waiting


async def test_rebuild_gives_back_a_partly_committed_gang_that_cannot_be_completed_and_decides_it_whole(bus: Bus):
    members = gang("train", 2)
    clique_of = await partly_committed(bus, members)
    (partial,) = [e for e, _ in await stored(bus)]
    # Since then the rest of that clique was taken, and the other clique too: the gang cannot be
    # completed where its first member is, nor placed whole anywhere.
    others = [n for n in clique_of if n != partial.node]
    fillers = {node: claim(f"filler-{node}", 4) for node in others}
    filling = Allocator(bus)
    await filling.rebuild()
    for node, filler in fillers.items():
        (outcome,) = filling.engine.allocate([filler], within=1 << filling.engine.inventory.node_rank[node])
        assert outcome.status == "allocated" and outcome.node == node
        await bus.publish(ev.ClaimSubmitted(claim=filler))
        decided = msgspec.structs.replace(filler, status=ResourceClaimStatus(allocation=outcome.allocation))
        await bus.publish(ev.AllocationCommitted(claim=decided, node=node))

    successor = Allocator(bus)
    await successor.rebuild()
    before = len(await stored(bus))
    # The first attempt never leaves (the connection breaks before the batch is sent): nothing
    # changes, in the stream or in the allocator, and the next attempt decides the same.
    send_batch = bus.send_batch

    async def broken(*args: object, **kwargs: object) -> None:
        bus.send_batch = send_batch  # type: ignore[method-assign]
        raise ConnectionError("connection lost")

    bus.send_batch = broken  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await decide_waiting(successor)
    assert len(await stored(bus)) == before
    assert successor.engine.ledger.claims.get(members[0].key)  # still holds what the stream says it holds
    await decide_waiting(successor)
    found = await stored(bus)
    written = found[before:]
    keys = {m.key for m in members}
    # One atomic batch: the partial member gives its devices back, and every member fails whole.
    assert [type(e).__name__ for e, _ in written] == ["AllocationReleased", "AllocationFailed", "AllocationFailed"]
    assert len({h["Nats-Batch-Id"] for _, h in written}) == 1
    assert {e.key for e, _ in written if isinstance(e, ev.AllocationFailed)} == keys
    assert not set(holders(found).values()) & keys  # no member holds a device
    assert not successor.engine.ledger.claims.get(members[0].key)
    assert set(successor.waiting) >= keys

    # Room in the other clique: the gang is placed there whole.
    other_clique = {n for n in others if clique_of[n] != clique_of[partial.node]}
    for node in sorted(other_clique):
        await successor.on_claim(ev.ClaimDeleted(namespace=NAMESPACE, name=fillers[node].metadata.name, uid=fillers[node].metadata.uid or ""))
    await decide_waiting(successor)
    found = await stored(bus)
    last = {}
    for event, _ in found:
        if event.key in keys:
            last[event.key] = event
    assert all(isinstance(e, ev.AllocationCommitted) for e in last.values()), last
    assert {clique_of[e.node] for e in last.values()} == {clique_of[n] for n in other_clique}
    assert set(holders(found).values()) >= keys


async def test_a_batch_cut_off_before_its_commit_stores_nothing(bus: Bus):
    """What the allocator relies on when it dies mid-batch: the server drops a batch that never
    got its commit, and the stream goes on as if it had never been sent."""
    members = gang("train", 2)
    events = [ev.AllocationCommitted(claim=m) for m in members]
    sender = await Bus.connect(bus.connected_url, name="doomed")
    original = connection(sender).publish
    sent = 0

    async def publish(subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None) -> None:
        nonlocal sent
        if sent == 1:  # the connection breaks after the first message: the commit never leaves
            await connection(sender).close()
            raise ConnectionError("connection lost")
        sent += 1
        await original(subject, payload, reply=reply, headers=headers)

    connection(sender).publish = publish  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await sender.send_batch(events, first={"Nats-Expected-Last-Sequence": "0"})
    assert (await bus.stream_state("ALLOCATIONS")).messages == 0
    ack = await (await bus.send_batch(events, first={"Nats-Expected-Last-Sequence": "0"}))
    assert (ack.seq, ack.batch_size) == (2, 2)


async def test_ensure_streams_turns_atomic_batches_on_for_an_allocations_stream_made_before_them():
    async with embedded_nats() as url, await Bus.connect(url, name="test") as bus:
        older = dataclasses.replace(STREAMS["ALLOCATIONS"], allow_atomic=None)  # as an older version made it
        await jetstream(bus).add_stream(older)
        decision = ev.AllocationFailed(namespace=NAMESPACE, name="x", uid="u", generation=1, reason="unsatisfiable", message="no room")
        await bus.publish(decision)
        with pytest.raises(ApiError, match="atomic publish is disabled"):
            await (await bus.send_batch([ev.AllocationCommitted(claim=m) for m in gang("train", 2)]))

        await bus.ensure_streams()
        assert (await jetstream(bus).stream_info("ALLOCATIONS")).config.allow_atomic
        commits = [ev.AllocationCommitted(claim=m) for m in gang("train", 2)]
        ack = await (await bus.send_batch(commits, first={"Nats-Expected-Last-Sequence": "1"}))
        assert (ack.seq, ack.batch_size) == (3, 2)
        assert [e for e, _ in await stored(bus)] == [decision, *commits]  # the earlier decision kept


async def test_a_gang_whose_commit_the_bus_cuts_before_a_sigkill_is_stored_whole_or_not_at_all_and_completed_after_restart():
    members = gang("job", 2, gpus=4, domain="kubernetes.io/hostname")  # both on one 8-GPU node
    keys = {m.key for m in members}
    async with Stack(nodes=2) as stack, await Bus.connect(stack.nats.url, name="test") as bus:
        await stack.ready(bus)
        # The bus fails part way: ALLOCATIONS takes one more message, then refuses every write.
        info = await jetstream(bus).stream_info("ALLOCATIONS")
        capped = info.config
        capped.max_msgs, capped.discard = info.state.messages + 1, DiscardPolicy.NEW
        await jetstream(bus).update_stream(capped)
        tried = asyncio.Event()  # a member's decision went out (stored or not)

        async def on_decision(_: object) -> None:
            tried.set()

        watch = await connection(bus).subscribe(f"dra.allocations.{NAMESPACE}.>", cb=on_decision)
        for member in members:
            await bus.publish(ev.ClaimSubmitted(claim=member))
        await asyncio.wait_for(tried.wait(), 30)
        await asyncio.sleep(1.0)  # the allocator goes on: refused, its term ends, the next one tries again
        (allocator,) = stack.allocators_()
        await allocator.kill()
        await watch.unsubscribe()

        found = await stored(bus)
        assert len([e for e, _ in found if isinstance(e, ev.AllocationCommitted) and e.key in keys]) in (0, len(members))
        assert not set(holders(found).values()) & keys  # here: none at all (the bus refused the gang)

        capped.max_msgs, capped.discard = -1, DiscardPolicy.OLD
        await jetstream(bus).update_stream(capped)
        await allocator.start()
        async with asyncio.timeout(60):
            while not keys <= set(holders(found := await stored(bus)).values()):
                await asyncio.sleep(0.2)
        by_key = outcomes(found, keys)
        assert all(len(o) == 1 and isinstance(o[0], ev.AllocationCommitted) for o in by_key.values()), by_key
        assert len({o[0].node for o in by_key.values()}) == 1  # one domain: one node's hostname
        # The status writer, unchanged, sees each member as its own commit.
        kv = await bus.key_value("dralloc-claims")
        async with asyncio.timeout(30):
            while True:
                states = [msgspec.json.decode((await kv.get(k)).value) for k in sorted(keys) if k in set(await kv.keys())]
                if len(states) == len(keys) and all(s["state"] == "allocated" for s in states):
                    break
                await asyncio.sleep(0.2)
        assert {s["node"] for s in states} == {by_key[k][0].node for k in keys}
