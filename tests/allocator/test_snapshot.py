"""The snapshot of live decisions (services/allocator/snapshot*.py) against a real nats-server: a
standby that loads it and replays only the stream after it holds what a full replay gives; a
snapshot that is corrupt, forged or stale is refused with the reason logged, and the full replay
is used instead."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.service import Allocator, Config, serve
from dralloc.allocator.snapshot import Compacted, Policy, SnapshotUnusable, decode_body, encode_body, make_head, merge
from dralloc.bus import KeyNotFound
from dralloc.bus.raw import jetstream
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas import snapshot as fmt
from dralloc.schemas.resource import ResourceClaim

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"


async def publish_fleet(bus, nodes: int) -> None:
    """The example DeviceClasses and `nodes` 8-GPU H100 nodes (node-0, ...) published on `bus`."""
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        await bus.publish(event)
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": nodes, "prefix": "node"}]):
        for slice_ in slices:
            await bus.publish(ev.ResourceSlicePublished(slice=slice_))


def claim_event(name: str, gpus: int = 1) -> ev.ClaimSubmitted:
    claim = msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4()), "generation": 1},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )  # fmt: skip
    return ev.ClaimSubmitted(claim=claim)


async def submit(bus, allocator: Allocator, name: str, gpus: int = 1) -> ev.ClaimSubmitted:
    event = claim_event(name, gpus)
    await bus.publish(event)
    await allocator.on_claim(event)
    return event


async def delete(bus, allocator: Allocator, submitted: ev.ClaimSubmitted) -> None:
    meta = submitted.claim.metadata
    event = ev.ClaimDeleted(namespace=meta.namespace, name=meta.name, uid=meta.uid)
    await bus.publish(event)
    await allocator.on_claim(event)


def state(allocator: Allocator) -> dict:
    """What a term decides from: the commits (with their allocations), the devices held, the waiting claims."""
    return {
        "committed": {key: msgspec.json.encode(event.allocation) for key, event in allocator.committed.items()},
        "held": sorted(allocator.engine.ledger.claims),
        "devices": sorted((str(device), holder) for device, holder in allocator.engine.ledger.exclusive.items()),
        "used": allocator.engine.ledger.used_bits,
        "waiting": sorted(allocator.waiting),
    }


async def standby(bus) -> Allocator:
    fresh = Allocator(bus)
    await fresh.rebuild()
    return fresh


@pytest.fixture
async def history(bus):
    """A leader's history on two 8-GPU nodes: claims committed and deleted before the snapshot,
    one that does not fit (waiting), the snapshot, then releases and commits after it."""
    await publish_fleet(bus, 2)
    leader = Allocator(bus)
    await leader.rebuild()
    before = [await submit(bus, leader, f"c{i}") for i in range(12)]
    for submitted in before[:4]:
        await delete(bus, leader, submitted)
    await submit(bus, leader, "too-big", gpus=32)  # unsatisfiable: waits
    head = await leader.snapshots.write()
    assert head is not None and head.seq == leader.last_seq
    for submitted in before[4:6]:
        await delete(bus, leader, submitted)  # released after the snapshot
    after = [await submit(bus, leader, f"d{i}") for i in range(4)]
    await delete(bus, leader, after[0])
    return leader, head


async def test_a_standby_loads_the_snapshot_and_the_tail_and_holds_what_a_full_replay_gives(bus, history):
    leader, head = history
    through_snapshot = await standby(bus)
    assert through_snapshot.snapshots.loaded_from == "snapshot"
    assert through_snapshot.snapshots.tail_messages == leader.last_seq - head.seq > 0
    assert through_snapshot.last_seq == leader.last_seq

    kv = await bus.key_value(fmt.BUCKET)
    await kv.delete(fmt.HEAD)
    full = await standby(bus)
    assert full.snapshots.loaded_from == "full"

    assert state(through_snapshot) == state(full) == state(leader)
    committed = set(through_snapshot.committed)
    assert committed == {f"ml/c{i}" for i in range(6, 12)} | {f"ml/d{i}" for i in range(1, 4)}  # c4, c5 released after it
    assert through_snapshot.waiting.keys() == {"ml/too-big"}


async def test_the_standby_decides_on_from_the_snapshot_behind_the_fence(bus, history):
    leader, _ = history
    successor = await standby(bus)
    assert successor.snapshots.loaded_from == "snapshot"
    await submit(bus, successor, "e0")  # its fence (the stream's last sequence) is right: the write is stored
    assert "ml/e0" in successor.committed
    assert successor.last_seq == leader.last_seq + 1


def forged_body(head: fmt.SnapshotHead, decisions: list[ev.AllocationEvent], **changes) -> tuple[fmt.SnapshotHead, bytes]:
    body = encode_body(decisions)
    made = make_head(body, len(decisions), seq=head.seq, stream_created=head.stream_created, chunk_set=head.chunk_set, chunk_size=1 << 20, epoch=0)
    return msgspec.structs.replace(made, **changes), body


async def spoil(bus, case: str, head: fmt.SnapshotHead, leader: Allocator) -> None:
    kv = await bus.key_value(fmt.BUCKET)
    chunk = fmt.chunk_key(head.chunk_set, 0)
    body = (await kv.get(chunk)).value
    decisions = decode_body(head, body)
    if case == "garbage head":
        await kv.put(fmt.HEAD, b'{"format": 1, "seq": ')
    elif case == "unknown format":
        await kv.put(fmt.HEAD, fmt.encode_head(msgspec.structs.replace(head, format=2)))
    elif case == "a flipped byte":
        await kv.put(chunk, body[:10] + bytes([body[10] ^ 1]) + body[11:])
    elif case == "missing chunk":
        await kv.put(fmt.HEAD, fmt.encode_head(msgspec.structs.replace(head, chunk_set="b")))
    elif case == "ahead of the stream":
        await kv.put(fmt.HEAD, fmt.encode_head(msgspec.structs.replace(head, seq=leader.last_seq + 5)))
    elif case == "larger than the stream":
        await kv.put(fmt.HEAD, fmt.encode_head(msgspec.structs.replace(head, size=10**9, chunks=1000)))
    elif case == "weakened bucket":  # a value size limit: snapshots would stop fitting
        info = await jetstream(bus).stream_info(f"KV_{fmt.BUCKET}")
        await jetstream(bus).update_stream(dataclasses.replace(info.config, max_msg_size=100))
    elif case == "another stream":
        await kv.put(fmt.HEAD, fmt.encode_head(msgspec.structs.replace(head, stream_created="2020-01-01T00:00:00+00:00")))
    elif case in ("forged decision", "not a decision", "claim twice"):
        one = next(d for d in decisions if isinstance(d, ev.AllocationCommitted))
        if case == "forged decision":  # self-consistent (its sha256 is right): only the stream can tell
            meta = msgspec.structs.replace(one.claim.metadata, name="never-decided", uid=str(uuid.uuid4()))
            extra = [ev.AllocationCommitted(claim=msgspec.structs.replace(one.claim, metadata=meta), node=one.node)]
        elif case == "not a decision":
            extra = [ev.AllocationReleased(namespace="ml", name="c0", uid="x")]
        else:
            extra = [one]
        forged, forged_bytes = forged_body(head, decisions + extra)
        await kv.put(chunk, forged_bytes)
        await kv.put(fmt.HEAD, fmt.encode_head(forged))
    elif case == "stale":  # a whole, true snapshot of a stream since purged and refilled
        await jetstream(bus).purge_stream("ALLOCATIONS")
    else:
        raise AssertionError(case)


REASONS = {
    "garbage head": "head is not a snapshot head: Input data was truncated",
    "unknown format": "format 2",
    "a flipped byte": "sha256",
    "missing chunk": "chunk b.0 is missing",
    "ahead of the stream": "past the stream's last",
    "another stream": "made of a stream created 2020",
    "weakened bucket": "bucket dralloc-snapshot is weakened: max_msg_size is 100",
    "larger than the stream": "is larger than ALLOCATIONS",
    "forged decision": "of which ALLOCATIONS holds none",
    "not a decision": "is a AllocationReleased",
    "claim twice": "appears twice",
    "stale": "no longer holds the messages after",
}


@pytest.mark.parametrize("case", sorted(REASONS))
async def test_an_unusable_snapshot_is_refused_with_its_reason_and_the_stream_replayed_whole(bus, history, case, caplog):
    leader, head = history
    await spoil(bus, case, head, leader)
    with caplog.at_level(logging.WARNING, logger="dralloc.allocator.snapshot"):
        rebuilt = await standby(bus)
    assert rebuilt.snapshots.loaded_from == "full"
    refused = [r.getMessage() for r in caplog.records if "snapshot of ALLOCATIONS not used" in r.getMessage()]
    assert len(refused) == 1 and REASONS[case] in refused[0], refused
    if case != "stale":
        assert state(rebuilt) == state(leader)  # the full replay: nothing of the snapshot was taken
    else:
        assert rebuilt.committed == {}  # (the stream holds nothing now, whatever the snapshot said)


async def test_the_leader_writes_snapshots_by_its_policy_and_not_while_nothing_changed(bus):
    await publish_fleet(bus, 1)
    leader = Allocator(bus, snapshot=Policy(every=3, seconds=3600))
    await leader.rebuild()
    term = asyncio.Event()
    keeper = asyncio.create_task(leader.snapshots.keep(term))
    kv = await bus.key_value(fmt.BUCKET)
    for _ in range(10):  # churn: 20 decisions, at most one claim live
        await delete(bus, leader, await submit(bus, leader, "churn"))
    head = None
    for _ in range(400):  # the keeper runs off the decisions' path: wait for it
        head = fmt.decode_head((await kv.get(fmt.HEAD)).value) if await _has_head(kv) else None
        if head is not None and head.seq >= 18:
            break
        await asyncio.sleep(0.05)
    term.set()
    await keeper
    assert head is not None and head.seq >= 18 and head.decisions == (head.seq % 2)  # (a commit stands at an odd sequence)
    last = await leader.snapshots.write()  # a clean handover: the rest, if any
    assert (last or head).seq == leader.last_seq == 20
    assert await leader.snapshots.write() is None  # nothing new: nothing written


async def test_a_leader_stopped_cleanly_leaves_a_snapshot_that_its_successor_loads_whole(bus):
    await publish_fleet(bus, 1)
    stop = asyncio.Event()
    leading = asyncio.create_task(serve(bus, Config(lease_ttl=1.0, snapshot=Policy(every=1000, seconds=3600)), stop))
    for i in range(6):
        await bus.publish(claim_event(f"s{i}"))
    async with asyncio.timeout(60):  # the leader decides them from CLAIMS
        while (await bus.stream_state("ALLOCATIONS")).messages < 6:
            await asyncio.sleep(0.05)
    stop.set()  # SIGTERM: the term ends, the snapshot covers every decision (the count trigger was far)
    await leading
    kv = await bus.key_value(fmt.BUCKET)
    head = fmt.decode_head((await kv.get(fmt.HEAD)).value)
    assert head.seq == 6 and head.decisions == 6 and head.epoch > 0
    successor = await standby(bus)
    assert successor.snapshots.loaded_from == "snapshot" and successor.snapshots.tail_messages == 0
    assert set(successor.committed) == {f"ml/s{i}" for i in range(6)}


async def _has_head(kv) -> bool:
    try:
        await kv.get(fmt.HEAD)
        return True
    except KeyNotFound:
        return False


# -- the pure core ------------------------------------------------------------------------


def test_compacted_follows_writes_stored_out_of_order_and_forgets_released_claims():
    a, b = claim_event("a").claim, claim_event("b").claim
    commit_a = ev.AllocationCommitted(claim=a)
    commit_b = ev.AllocationCommitted(claim=b)
    release_a = ev.AllocationReleased(namespace="ml", name="a", uid=a.metadata.uid)
    compacted = Compacted()
    compacted.load([], 10)
    assert compacted.stored(12, [commit_b]) == 0  # 11 not answered yet: nothing covered past 10
    assert compacted.seq == 10 and compacted.latest == {}
    assert compacted.stored(11, [commit_a]) == 2
    assert compacted.seq == 12 and list(compacted.latest.values()) == [commit_a, commit_b]
    compacted.stored(13, [release_a, commit_a])  # a batch: given back and committed again
    assert list(compacted.latest.values()) == [commit_b, commit_a]
    compacted.stored(15, [release_a])
    assert list(compacted.latest.values()) == [commit_b] and compacted.seq == 15


def test_the_policy_writes_every_n_decisions_or_as_many_as_are_live_or_after_a_while():
    policy = Policy(every=100, seconds=60)
    assert not policy.due(99, 0.0) and policy.due(100, 0.0)
    assert not policy.due(999, 0.0, live=1000) and policy.due(1000, 0.0, live=1000)  # its cost grows with the live set
    assert policy.due(1, 60.0) and not policy.due(0, 600.0)  # nothing changed: nothing to write
    assert policy.most_unsnapshotted(10) == 99 and policy.most_unsnapshotted(5000) == 4999


def test_merge_takes_the_tail_over_the_snapshot_in_stream_order():
    a, b, c = (ev.AllocationCommitted(claim=claim_event(n).claim) for n in "abc")
    a_released = ev.AllocationReleased(namespace="ml", name="a", uid="u")
    assert merge([a, b], [c, a_released]) == [b, c, a_released]


def test_a_body_that_does_not_match_its_head_is_refused():
    decisions = [ev.AllocationCommitted(claim=claim_event(n).claim) for n in "ab"]
    body = encode_body(decisions)
    head = make_head(body, 2, seq=5, stream_created="t", chunk_set="a", chunk_size=100, epoch=1)
    assert decode_body(head, body) == decisions
    assert head.chunks == -(-len(body) // 100)
    with pytest.raises(SnapshotUnusable, match="holds 2 decisions, the head says 3"):
        decode_body(msgspec.structs.replace(head, decisions=3), body)
    with pytest.raises(SnapshotUnusable, match="bytes, the head says"):
        decode_body(head, body + b" ")


def test_a_head_out_of_bounds_is_refused():
    good = make_head(b"x" * 10, 1, seq=5, stream_created="t", chunk_set="a", chunk_size=4, epoch=1)
    assert fmt.decode_head(fmt.encode_head(good)) == good
    for changes, reason in [
        ({"seq": 0}, "not a stream sequence"),
        ({"chunk_set": "../x"}, "chunk set"),
        ({"size": fmt.MAX_BODY_BYTES + 1}, "at most"),
        ({"chunks": 0}, "chunks for a body"),
        ({"sha256": "zz"}, "sha256"),
    ]:
        with pytest.raises(ValueError, match=reason):
            fmt.decode_head(fmt.encode_head(msgspec.structs.replace(good, **changes)))
    with pytest.raises(ValueError, match="not a snapshot head"):
        fmt.decode_head(b'{"format": 1, "extra": true}')
    with pytest.raises(ValueError, match="bytes"):
        fmt.decode_head(b" " * (fmt.MAX_HEAD_BYTES + 1))


@pytest.mark.parametrize("value", ["0", "-5", "ten", "1e3", "", "9" * 40, "٣"])
def test_a_malformed_snapshot_interval_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("DRALLOC_ALLOCATOR_SNAPSHOT_EVERY", value)
    with pytest.raises(ValueError, match="DRALLOC_ALLOCATOR_SNAPSHOT_EVERY must be a positive whole number"):
        Config.from_env()


def test_the_snapshot_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRALLOC_ALLOCATOR_SNAPSHOT_EVERY", "250")
    assert Config.from_env().snapshot.every == 250


async def test_a_standby_reading_through_a_replica_behind_its_leader_reads_again_or_does_not_start(bus, history, monkeypatch):
    """JetStream puts a reading consumer on any of the stream's servers, and one still catching up
    hands over fewer decisions than the leader's last sequence, which the term's fence then expects:
    its first write would pass without the term having read the last decisions. The rebuild asks
    the leader, reads again and holds what the leader holds; a replica that stays behind ends the
    term before it starts."""
    from dralloc.bus import ReplicaBehind, read, replay

    monkeypatch.setattr(replay, "READ_AGAIN_S", 0.01)
    leader, _ = history
    real, reads, behind_for = read.scan_js, [], [1]
    holds = leader.last_seq - 2  # the replica lacks the last two decisions

    async def scan_js(js, stream, on_message, **options):  # (what a consumer on that replica delivers)
        if stream == "ALLOCATIONS":
            reads.append(stream)
        behind = stream == "ALLOCATIONS" and len(reads) <= behind_for[0]
        await real(js, stream, lambda msg: None if behind and msg.sequence > holds else on_message(msg), **options)

    monkeypatch.setattr(read, "scan_js", scan_js)
    rebuilt = await standby(bus)
    assert rebuilt.snapshots.loaded_from == "full"  # the tail after the snapshot fell short: the stream read whole, checked
    assert state(rebuilt) == state(leader) and rebuilt.last_seq == leader.last_seq
    behind_for[0] = 1_000
    with pytest.raises(ExceptionGroup) as refused:  # (the rebuild's reads run as a task group)
        await standby(bus)
    assert refused.group_contains(ReplicaBehind, match="its leader holds")
