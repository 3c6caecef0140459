"""The bus's defences with a real nats-server (under infra/nats/auth.conf where a credential matters)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import urllib.request

import hostile
import pytest
from pipeline import NatsServer, claim_event

from dralloc import natsauth, probes
from dralloc.bus import Bus, BusError, dead_letter_message, header_bytes, run_service, streamcheck
from dralloc.bus.raw import connection, jetstream
from dralloc.schemas import events as ev


@pytest.fixture
async def secured(tmp_path):
    """A nats-server under auth.conf (with node-0's discovery user), streams made by the allocator's user."""
    credentials = hostile.Credentials()
    (tmp_path / "auth.conf").write_text(natsauth.with_node_users(hostile.AUTH.read_text(), [hostile.NODE_USER]))
    server = NatsServer(tmp_path, config="include ./auth.conf\n", env=credentials.server_env())
    await server.start()
    try:
        async with await Bus.connect(credentials.url(server.url, "allocator"), name="allocator") as allocator:
            await allocator.ensure_streams()
        yield server, credentials
    finally:
        await server.stop()


async def test_max_deliveries_advisory_dead_letters_under_auth(secured):
    """Item 7: the allocator's user may subscribe to its consumer's max-deliveries advisory."""
    server, credentials = secured
    async with await Bus.connect(credentials.url(server.url, "ingestor"), name="ingestor") as ingestor:
        await ingestor.publish(claim_event("poison"))
    async with await Bus.connect(credentials.url(server.url, "allocator"), name="allocator") as allocator:
        entered = asyncio.Event()

        async def dies(event: ev.Event) -> None:
            entered.set()
            await asyncio.sleep(3600)  # never acks: as a consumer that hangs on this message every time

        for _ in range(2):
            entered.clear()
            task = asyncio.create_task(allocator.consume("CLAIMS", dies, asyncio.Event(), durable="allocator", ack_wait=0.5, max_deliver=2))
            await asyncio.wait_for(entered.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        stop = asyncio.Event()
        task = asyncio.create_task(allocator.consume("CLAIMS", dies, stop, durable="allocator", ack_wait=0.5, max_deliver=2))
        try:
            async with asyncio.timeout(10):
                while not (await allocator.stream_state("DEADLETTER")).messages:
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            task.cancel()
    async with await Bus.connect(credentials.url(server.url, "admin"), name="admin") as admin:
        (letter,) = await admin.dead_letters()
    assert letter.subject == claim_event("poison").subject and "without an ack" in letter.reason


async def test_a_service_refuses_to_run_on_a_weakened_stream(secured):
    """Item 4: ALLOCATIONS cut to max_msgs=1 (by an operator: no service user may): every service,
    the allocator included, exits non-zero naming the stream and the limit."""
    server, credentials = secured
    async with await Bus.connect(credentials.url(server.url, "admin"), name="admin") as admin:
        config = (await jetstream(admin).stream_info("ALLOCATIONS")).config
        await jetstream(admin).update_stream(dataclasses.replace(config, max_msgs=1))
    for service in ("statuswriter", "allocator"):
        done = subprocess.run(
            [sys.executable, "-m", "dralloc.cli", "run", service, "--nats-url", credentials.url(server.url, service)],
            capture_output=True, text=True, timeout=60, env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "stream ALLOCATIONS has been weakened: max_msgs is 1" in done.stderr
        assert "Traceback" not in done.stderr and credentials.passwords[service] not in done.stderr


async def test_a_service_waits_for_the_streams_and_may_not_create_them(tmp_path):
    """Only the allocator's user creates streams: another service waits for them, and is refused if it tries."""
    credentials = hostile.Credentials()
    (tmp_path / "auth.conf").write_text(hostile.AUTH.read_text())
    server = NatsServer(tmp_path, config="include ./auth.conf\n", env=credentials.server_env())
    await server.start()
    try:
        async with await Bus.connect(credentials.url(server.url, "ingestor"), name="ingestor") as ingestor:
            with pytest.raises((TimeoutError, BusError)):  # a permissions violation: no answer
                await asyncio.wait_for(jetstream(ingestor).add_stream(streamcheck_config("CLAIMS")), 2)
            waiting = asyncio.create_task(ingestor.check_streams(wait=0.1))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            async with await Bus.connect(credentials.url(server.url, "allocator"), name="allocator") as allocator:
                await allocator.ensure_streams()
            await asyncio.wait_for(waiting, 10)
    finally:
        await server.stop()


def streamcheck_config(name: str):
    from dralloc.bus import STREAMS

    return STREAMS[name]


async def test_a_connection_closed_for_good_ends_the_service_non_zero(nats_url):
    """Item 1: run_service does not stay up deciding nothing when its connection is closed for good."""
    serving = asyncio.Event()

    async def serve(bus: Bus, config: object, stop: asyncio.Event) -> None:
        serving.set()
        await connection(bus).close()  # as when the server closes it on a protocol error
        await stop.wait()

    with pytest.raises(BusError, match="closed for good"):
        await asyncio.wait_for(run_service("allocator", serve, None, nats_url), 20)
    assert serving.is_set()


async def test_probes_answer_ready_and_live_and_fail_when_the_connection_is_gone(nats_url, monkeypatch):
    monkeypatch.setenv("DRALLOC_HEALTH_PORT", "0")
    monkeypatch.setenv("DRALLOC_HEALTH_HOST", "127.0.0.1")
    async with await Bus.connect(nats_url, name="probed") as bus:
        ready = asyncio.Event()
        async with probes.serve_probes(bus, ready) as port:

            def get(path: str) -> int:
                try:
                    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
                except urllib.error.HTTPError as exc:
                    return exc.code

            assert await asyncio.to_thread(get, "/readyz") == 503  # not serving yet
            assert await asyncio.to_thread(get, "/livez") == 200
            ready.set()
            assert await asyncio.to_thread(get, "/readyz") == 200
            bus.pulses["allocator"] = 0.0  # a consumer that has not moved since the start of time
            assert await asyncio.to_thread(get, "/livez") == 503
            del bus.pulses["allocator"]
            await connection(bus).close()
            assert await asyncio.to_thread(get, "/livez") == 503


def test_probe_verdict():
    assert probes.verdict(closed=False, connected=True, pulses={"a": 100.0}, now=130.0, stall=60) == (True, "ok")
    alive, reason = probes.verdict(closed=False, connected=True, pulses={"a": 100.0, "b": 10.0}, now=130.0, stall=60)
    assert not alive and "b" in reason and "a," not in reason
    assert not probes.verdict(closed=True, connected=False, pulses={}, now=0, stall=60)[0]


@pytest.mark.parametrize("size", [0, 100, 500_000, 1_048_576, 5_000_000])
def test_a_dead_letter_always_fits_under_max_payload(size):
    subject = "dra.claims." + "x" * 2000
    shown, headers, body = dead_letter_message("CLAIMS", "allocator", 7, subject, b"y" * size, "why " * 500, 1_048_576)
    assert len(body) + header_bytes(headers) <= 1_048_576 - 256
    assert headers["Dralloc-Sequence"] == "7" and headers["Dralloc-Stream"] == "CLAIMS"
    assert ("Dralloc-Truncated" in headers) == (len(body) < size)
    assert body == b"y" * len(body) and len(shown) <= 512


def test_credentials_are_redacted_from_urls_in_text():
    text = "cannot connect to nats://alloc:s3cr3t@10.0.0.1:4222 or tls://tok3n@nats:4222, not nats://host:4222"
    assert natsauth.redact(text) == "cannot connect to nats://***@10.0.0.1:4222 or tls://***@nats:4222, not nats://host:4222"


def test_per_node_users_are_generated_and_colliding_names_refused():
    text = natsauth.with_node_users(hostile.AUTH.read_text(), ["node-0", "gpu.example.com"])
    assert '"discovery-gpu.example.com"' in text and "$DRALLOC_NODE_GPU_EXAMPLE_COM_NATS_PASSWORD" in text
    token = ev.subject("inventory", "driver", "gpu.example.com", "slice").split(".")[3]  # as events encode it
    assert token != "gpu" and f'"dra.inventory.*.{token}.*"' in text
    with pytest.raises(ValueError, match="share the password variable"):
        natsauth.with_node_users(hostile.AUTH.read_text(), ["a-b", "a.b"])


def test_the_auth_conf_named_is_read_only_up_to_the_limit():
    """`python -m dralloc.natsauth nodes ... --auth FILE` prints the conf with the nodes' users; a
    FILE with no end (/dev/zero: stat says 0 bytes) is an error at 16 MiB, not read until memory runs out."""
    run = [sys.executable, "-m", "dralloc.natsauth", "nodes", "node-0", "--auth"]
    good = subprocess.run([*run, str(hostile.AUTH)], capture_output=True, text=True, timeout=60, check=False)
    assert good.returncode == 0 and '"discovery-node-0"' in good.stdout
    endless = subprocess.run([*run, "/dev/zero"], capture_output=True, text=True, timeout=60, check=False)
    assert endless.returncode == 1 and endless.stdout == ""
    assert endless.stderr.strip() == "error: larger than 16 MiB"


def test_events_belong_only_in_their_stream_under_their_own_subject():
    submitted = claim_event("x")
    assert streamcheck.misplaced("CLAIMS", submitted.subject, submitted) is None
    assert "does not belong in ALLOCATIONS" in streamcheck.misplaced("ALLOCATIONS", submitted.subject, submitted)
    assert "names another object" in streamcheck.misplaced("CLAIMS", ev.subject("claims", "bench", "y"), submitted)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"max_msgs": 1}, "max_msgs is 1"),
        ({"max_age": 60.0}, "max_age is 60.0s"),
        ({"max_bytes": 1024}, "max_bytes is 1024"),
        ({"duplicate_window": 1.0}, "duplicate_window is 1.0s"),
        ({"subjects": ["dra.allocations.x.>"]}, "subjects are"),
        ({"allow_rollup_hdrs": True}, "allow_rollup_hdrs is on"),
        ({"allow_msg_ttl": True}, "allow_msg_ttl is on"),
        ({"num_replicas": 1}, "num_replicas is 1"),
    ],
)
def test_a_weakened_stream_is_told_from_one_that_keeps_more(change, problem):
    from dralloc.bus import STREAMS

    wanted = dataclasses.replace(STREAMS["ALLOCATIONS"], num_replicas=3)
    assert streamcheck.weakened(dataclasses.replace(wanted), wanted) == []
    assert any(problem in p for p in streamcheck.weakened(dataclasses.replace(wanted, **change), wanted))
    # made by an older release that kept every message per subject: keeps more, not weakened
    claims = STREAMS["CLAIMS"]
    assert streamcheck.weakened(dataclasses.replace(claims, max_msgs_per_subject=-1), claims) == []


async def test_the_status_writer_may_tell_of_a_refused_eviction_and_nothing_else_on_claims(secured):
    """Its user publishes an EvictionRefused on CLAIMS (its own subjects), never a claim or a Pod there."""
    server, credentials = secured
    refused = ev.EvictionRefused(namespace="ml", name="c", uid="u", pod="p", for_namespace="ml", for_pod="big", asked_at=1.0, message="budget")
    async with await Bus.connect(credentials.url(server.url, "statuswriter"), name="statuswriter") as writer:
        assert (await asyncio.wait_for(writer.publish(refused), 5)).stream == "CLAIMS"
        for forged in (claim_event("sneaky"), ev.PodDeleted(namespace="ml", name="big", uid="u")):
            with pytest.raises((TimeoutError, BusError)):  # a permissions violation: no ack ever comes
                await asyncio.wait_for(writer.publish(forged), 2)
