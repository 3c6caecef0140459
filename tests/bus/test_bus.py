"""The bus against a real nats-server: dedup, trace headers, ack-after-effect, redelivery, dead letters."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from dralloc.bus import Bus, Permanent, embedded_nats
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ObjectMeta, ResourceClaim, ResourcePool, ResourceSlice, ResourceSliceSpec


def claim(name: str, uid: str = "", namespace: str = "team-a") -> ev.ClaimSubmitted:
    return ev.ClaimSubmitted(claim=ResourceClaim(metadata=ObjectMeta(name=name, namespace=namespace, uid=uid or f"uid-{name}")))


async def run_until(bus: Bus, condition, stream: str = "CLAIMS", timeout: float = 10.0, **kwargs):
    """Consume with `kwargs` until condition() holds; returns the handled events."""
    seen: list[ev.Event] = []
    handler = kwargs.pop("handler", None)

    async def record(event: ev.Event) -> None:
        if handler:
            await handler(event)
        seen.append(event)

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(stream, record, stop, **kwargs))
    try:
        async with asyncio.timeout(timeout):
            while not condition(seen):
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
    return seen


async def dead_letters(bus: Bus) -> list:
    sub = await jetstream(bus).subscribe("dra.deadletter.>", stream="DEADLETTER", ordered_consumer=True)
    found = []
    try:
        while True:
            found.append(await sub.next_msg(timeout=0.5))
    except Exception:
        pass
    await sub.unsubscribe()
    return found


async def test_publish_is_deduplicated_by_content_identity(bus: Bus):
    first = await bus.publish(claim("a", uid="u1"))
    again = await bus.publish(claim("a", uid="u1"))
    other = await bus.publish(claim("a", uid="u2"))  # same name, new object (deleted and recreated)
    assert (first.seq, first.duplicate) == (1, None)
    assert (again.seq, again.duplicate) == (1, True)
    assert (other.seq, other.duplicate) == (2, None)
    assert (await bus.stream_state("CLAIMS")).messages == 1  # CLAIMS keeps the latest per claim


async def test_publish_carries_msg_id_and_trace_context(bus: Bus):
    from dralloc import telemetry

    telemetry.setup("test")
    event = claim("gpu.claim")  # a dot in the name: encoded in the subject
    await bus.publish(event)
    msg = await jetstream(bus).get_msg("CLAIMS", seq=1)
    assert msg.subject == "dra.claims.team-a.gpu%2Eclaim"
    assert msg.headers["Nats-Msg-Id"] == event.msg_id
    version, trace_id, span_id, flags = msg.headers["traceparent"].split("-")
    assert version == "00" and len(trace_id) == 32 and int(trace_id, 16) != 0
    assert ev.decode(msg.data) == event


async def test_failed_handler_is_retried_then_acked(bus: Bus):
    await bus.publish(claim("a"))
    calls = 0

    async def flaky(event: ev.Event) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("transient")

    seen = await run_until(bus, lambda seen: len(seen) == 1, handler=flaky, durable="flaky")
    assert calls == 2 and seen[0].claim.metadata.name == "a"
    info = await jetstream(bus).consumer_info("CLAIMS", "flaky")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_consumer_dying_before_ack_gets_the_message_again(bus: Bus):
    await bus.publish(claim("a"))
    entered = asyncio.Event()

    async def dies(event: ev.Event) -> None:
        entered.set()
        await asyncio.sleep(3600)  # the process "dies" here: cancelled, never acks

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("CLAIMS", dies, stop, durable="worker", ack_wait=1.0))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    seen = await run_until(bus, lambda seen: len(seen) == 1, durable="worker", ack_wait=1.0)
    assert seen[0].claim.metadata.name == "a"


async def test_undecodable_message_is_dead_lettered_and_processing_continues(bus: Bus):
    await bus.publish(claim("before"))
    await jetstream(bus).publish("dra.claims.team-a.junk", b"\x00not json")
    await jetstream(bus).publish("dra.claims.team-a.future", b'{"type":"ClaimSubmitted","schemaVersion":99,"claim":{"metadata":{"name":"x"}}}')
    await bus.publish(claim("after"))

    seen = await run_until(bus, lambda seen: len(seen) == 2, durable="allocator")
    assert [e.claim.metadata.name for e in seen] == ["before", "after"]

    letters = await dead_letters(bus)
    assert [m.headers["Dralloc-Subject"] for m in letters] == ["dra.claims.team-a.junk", "dra.claims.team-a.future"]
    assert all(m.subject == "dra.deadletter.CLAIMS.allocator" for m in letters)
    assert "not a dralloc event" in letters[0].headers["Dralloc-Reason"]
    assert "schemaVersion 99" in letters[1].headers["Dralloc-Reason"]
    assert letters[0].data == b"\x00not json"
    info = await jetstream(bus).consumer_info("CLAIMS", "allocator")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_permanent_failure_and_exhausted_retries_are_dead_lettered(bus: Bus):
    await bus.publish(claim("hopeless"))
    await bus.publish(claim("broken"))
    await bus.publish(claim("fine"))

    async def handler(event: ev.Event) -> None:
        name = event.claim.metadata.name
        if name == "hopeless":
            raise Permanent("claim is hopeless")
        if name == "broken":
            raise RuntimeError("always fails")

    stop = asyncio.Event()
    handled: list[ev.Event] = []

    async def record(event: ev.Event) -> None:
        await handler(event)
        handled.append(event)

    task = asyncio.create_task(bus.consume("CLAIMS", record, stop, durable="w", max_deliver=3))
    async with asyncio.timeout(10):
        while (await bus.stream_state("DEADLETTER")).messages < 2:
            await asyncio.sleep(0.05)
    stop.set()
    await task
    assert [e.claim.metadata.name for e in handled] == ["fine"]
    letters = await dead_letters(bus)
    reasons = {m.headers["Dralloc-Subject"]: m.headers["Dralloc-Reason"] for m in letters}
    assert reasons["dra.claims.team-a.hopeless"] == "claim is hopeless"
    assert reasons["dra.claims.team-a.broken"] == "failed 3 times, last: always fails"


def a_slice(name: str, generation: int) -> ResourceSlice:
    return ResourceSlice(
        metadata=ObjectMeta(name=name),
        spec=ResourceSliceSpec(driver="gpu.nvidia.com", pool=ResourcePool(name="node-1", generation=generation, resource_slice_count=1)),
    )


async def test_replay_returns_the_current_value_per_subject(bus: Bus):
    await bus.publish(ev.ResourceSlicePublished(slice=a_slice("s1", 1)))
    await bus.publish(ev.ResourceSlicePublished(slice=a_slice("s2", 1)))
    await bus.publish(ev.ResourceSlicePublished(slice=a_slice("s1", 2)))
    await bus.publish(ev.ResourceSliceRemoved(name="s2", driver="gpu.nvidia.com", pool="node-1", generation=1))

    replayed, last_seq = await bus.replay("INVENTORY")
    assert last_seq == 4
    assert [(type(e).__name__, getattr(e, "name", None) or e.slice.spec.pool.generation) for e in replayed] == [
        ("ResourceSlicePublished", 2),
        ("ResourceSliceRemoved", "s2"),
    ]
    assert await bus.replay("ALLOCATIONS") == ([], 0)


async def test_ensure_streams_is_idempotent(bus: Bus):
    await bus.publish(claim("a"))
    await bus.ensure_streams()
    assert (await bus.stream_state("CLAIMS")).messages == 1


async def test_embedded_server_leaves_nothing_behind():
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("dralloc-nats-*"))
    async with embedded_nats() as url:
        (workdir,) = set(Path(tempfile.gettempdir()).glob("dralloc-nats-*")) - before
        servers = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(workdir) in _cmdline(pid)]
        assert len(servers) == 1
        bus = await Bus.connect(url)
        await bus.ensure_streams()
        await bus.close()
    assert not workdir.exists()
    assert not Path(f"/proc/{servers[0]}").exists()


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


async def test_a_message_that_kills_its_consumer_every_time_is_dead_lettered(bus: Bus):
    await bus.publish(claim("poison"))
    entered = asyncio.Event()

    async def dies(event: ev.Event) -> None:
        entered.set()
        await asyncio.sleep(3600)  # the process dies here, never acking

    for _ in range(2):  # two deliveries, two deaths
        entered.clear()
        stop = asyncio.Event()
        task = asyncio.create_task(bus.consume("CLAIMS", dies, stop, durable="worker", ack_wait=0.5, max_deliver=2))
        await asyncio.wait_for(entered.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    # The restarted consumer is no longer offered the message; it is dead-lettered and work goes on.
    await bus.publish(claim("next"))
    handled: list[ev.Event] = []

    async def record(event: ev.Event) -> None:
        handled.append(event)

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("CLAIMS", record, stop, durable="worker", ack_wait=0.5, max_deliver=2))
    async with asyncio.timeout(10):
        while not handled or not (await bus.stream_state("DEADLETTER")).messages:
            await asyncio.sleep(0.05)
    stop.set()
    await task
    assert [e.claim.metadata.name for e in handled] == ["next"]
    (letter,) = await dead_letters(bus)
    assert letter.headers["Dralloc-Subject"] == "dra.claims.team-a.poison"
    assert letter.headers["Dralloc-Reason"] == "delivered 2 times without an ack (the consumer died or timed out on each)"
    assert ev.decode(letter.data).claim.metadata.name == "poison"


async def test_dead_letters_are_listed_for_operators(bus: Bus, nats_url: str):
    await jetstream(bus).publish("dra.claims.team-a.junk", b"\x00not json")
    await bus.publish(claim("fine"))
    await run_until(bus, lambda seen: len(seen) == 1, durable="allocator")  # the junk came first
    (letter,) = await bus.dead_letters()
    assert (letter.stream, letter.consumer, letter.subject, letter.original_sequence) == ("CLAIMS", "allocator", "dra.claims.team-a.junk", 1)
    assert letter.reason.startswith("not a dralloc event") and letter.data == "\x00not json"

    import json
    import subprocess
    import sys

    env = {**os.environ, "NATS_URL": nats_url}
    dralloc = str(Path(sys.executable).parent / "dralloc")
    out = await asyncio.to_thread(subprocess.run, [dralloc, "get", "deadletters", "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["deadLetters"][0]["subject"] == "dra.claims.team-a.junk"
