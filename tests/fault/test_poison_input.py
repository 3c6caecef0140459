"""Poison that used to raise RecursionError past every decoder, and names the API server refuses,
against the services as real processes (`dralloc run ...`) on a real nats-server with one H100
node (tests/fault/conftest.py): nothing crashes, a rebuild replays past the poison, the bad
message gets a dead letter with its reason, and the next valid input is handled."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pipeline import Service, claim_event

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.statuswriter.sinks import read_all_checked

DEEP = "[" * 1000 + "]" * 1000


def deep_claim(name: str) -> bytes:
    """A ClaimSubmitted with 1,000 levels of nesting in its opaque driver parameters (~3 KB)."""
    doc = json.loads(ev.encode(claim_event(name)))
    doc["claim"]["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": "X"}}]
    return json.dumps(doc).replace('"X"', DEEP).encode()


def url_of(bus: Bus) -> str:
    url = bus.connected_url
    assert url is not None, "the test's bus is connected"
    return url


async def letters(bus: Bus) -> dict[str, str]:
    """Dead letters so far: original subject -> reason."""
    info = await jetstream(bus).stream_info("DEADLETTER")
    found: dict[str, str] = {}
    if not info.state.messages:
        return found
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await jetstream(bus).get_msg("DEADLETTER", seq=seq)
        found[msg.headers["Dralloc-Subject"]] = msg.headers["Dralloc-Reason"]
    return found


async def decision(bus: Bus, name: str, within: float = 30.0) -> ev.Event:
    async with asyncio.timeout(within):
        while True:
            try:
                return ev.decode((await jetstream(bus).get_last_msg("ALLOCATIONS", ev.subject("allocations", "bench", name))).data)
            except Exception:  # noqa: BLE001 - not there yet
                await asyncio.sleep(0.1)


def logged(root: Path, name: str) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(root.glob(f"{name}.*.log")))


async def test_a_rebuild_replays_past_deep_nesting_and_bad_names_in_claims(bus: Bus, tmp_path: Path):
    # Poison in CLAIMS before any allocator runs: its rebuild replays it, and its consumer reads it.
    await jetstream(bus).publish("dra.claims.bench.deep", deep_claim("deep"))
    spaced = json.loads(ev.encode(claim_event("x")))
    spaced["claim"]["metadata"]["name"] = "bad name"
    await jetstream(bus).publish("dra.claims.bench.bad%20name", json.dumps(spaced).encode())
    allocator = Service("allocator", ["allocator", "--nats-url", url_of(bus)], {"DRALLOC_ALLOCATOR_LEASE_TTL": "2"}, tmp_path)
    await allocator.start()
    try:
        await bus.publish(claim_event("after", gpus=2))
        assert isinstance(await decision(bus, "after"), ev.AllocationCommitted)
        assert allocator.pid is not None, logged(tmp_path, "allocator")
        async with asyncio.timeout(10):
            while len(found := await letters(bus)) < 2:
                await asyncio.sleep(0.1)
        assert "nested more than 100 levels deep" in found["dra.claims.bench.deep"]
        assert "'bad name' is not a DNS subdomain" in found["dra.claims.bench.bad%20name"]

        # A restart rebuilds from the same streams, poison included, and goes on deciding.
        await allocator.stop()
        await allocator.start()
        await bus.publish(claim_event("after-restart", gpus=2))
        assert isinstance(await decision(bus, "after-restart"), ev.AllocationCommitted)
        assert allocator.pid is not None
        assert "RecursionError" not in logged(tmp_path, "allocator") and "Traceback" not in logged(tmp_path, "allocator")
    finally:
        await allocator.stop()


async def test_the_status_writer_dead_letters_deep_nesting_and_keeps_writing(bus: Bus, tmp_path: Path):
    writer = Service("statuswriter", ["statuswriter", "--nats-url", url_of(bus)], {}, tmp_path)
    await writer.start()
    try:
        committed = json.loads(ev.encode(ev.AllocationCommitted(claim=claim_event("poison").claim, node="n-0")))
        committed["claim"]["metadata"]["annotations"] = {"x": "X"}  # inside a map of strings, even
        await jetstream(bus).publish("dra.allocations.bench.poison", json.dumps(committed).replace('"X"', DEEP).encode())
        big = ev.encode(ev.AllocationFailed(namespace="bench", name="big", uid="u", generation=1, reason="error", message="m"))
        await jetstream(bus).publish("dra.allocations.bench.big", big.replace(b'"generation":1', b'"generation":' + b"9" * 400))
        good = ev.AllocationFailed(namespace="bench", name="good", uid="u", generation=1, reason="unsatisfiable", message="no room")
        await bus.publish(good)
        kv = await bus.key_value("dralloc-claims")
        async with asyncio.timeout(20):
            while not (await read_all_checked(kv))[0]:
                await asyncio.sleep(0.1)
        statuses, problems = await read_all_checked(kv)
        assert [(s.claim, s.state) for s in statuses] == [("bench/good", "unsatisfiable")] and not problems
        found = await letters(bus)
        assert "nested more than 100 levels deep" in found["dra.allocations.bench.poison"]
        assert "an integer of 400 digits" in found["dra.allocations.bench.big"]
        assert writer.pid is not None and "Traceback" not in logged(tmp_path, "statuswriter")
    finally:
        await writer.stop()


CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: bench}}
spec:
  devices:
    requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com}}}}]
    config: [{{opaque: {{driver: gpu.nvidia.com, parameters: {parameters}}}}}]
"""


@pytest.mark.parametrize("source", ["deep", "bad-name"])
async def test_a_watching_ingestor_reports_a_poisoned_file_and_keeps_publishing_the_others(bus: Bus, tmp_path: Path, source: str):
    files = tmp_path / "claims"
    files.mkdir()
    (files / "a.yaml").write_text(CLAIM.format(name="first", parameters="{a: 1}"))
    if source == "deep":  # 990 levels: libyaml parses it (its limit is 1,000), the encoder then recursed
        (files / "b.json").write_text(CLAIM.format(name="poison", parameters="[" * 990 + "]" * 990))
    else:
        (files / "b.yaml").write_text(CLAIM.format(name='"team-a/b"', parameters="{a: 1}"))
    env = {"DRALLOC_INGESTOR_INTERVAL": "0.2"}
    ingestor = Service("ingestor", ["ingestor", "-f", str(files), "--watch", "--nats-url", url_of(bus)], env, tmp_path)
    await ingestor.start()
    try:

        async def published() -> set[str]:
            info = await jetstream(bus).stream_info("CLAIMS", subjects_filter="dra.claims.>")
            return set(info.state.subjects or {})

        async with asyncio.timeout(20):
            while "dra.claims.bench.first" not in await published():
                await asyncio.sleep(0.1)
        (files / "c.yaml").write_text(CLAIM.format(name="third", parameters="{a: 1}"))  # a file added later
        async with asyncio.timeout(20):
            while "dra.claims.bench.third" not in await published():
                await asyncio.sleep(0.1)
        assert await published() == {"dra.claims.bench.first", "dra.claims.bench.third"}
        assert ingestor.pid is not None
        log = logged(tmp_path, "ingestor")
        assert "Traceback" not in log and "RecursionError" not in log
        if source == "deep":
            assert "b.json (document 1): ResourceClaim/poison: spec.devices.config.0.opaque.parameters." in log
            assert "nested more than 100 levels deep" in log
        else:
            assert "ResourceClaim/team-a/b: field metadata.name: 'team-a/b' is not a DNS subdomain" in log
    finally:
        await ingestor.stop()


def ghost_slice(devices: int, *, node: str, pool: str) -> tuple[str, bytes]:
    """A GPU slice copied from the real node's (its devices match the classes), renamed; its subject and bytes."""
    from dralloc.discovery.fleet import build_fleet

    ((_, slices),) = build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": "n"}])
    doc = json.loads(ev.encode(ev.ResourceSlicePublished(slice=next(s for s in slices if s.spec.driver == "gpu.nvidia.com"))))
    device = doc["slice"]["spec"]["devices"][0]
    device = {"attributes": {k: v for k, v in device["attributes"].items() if k == "type"}}  # small: 6,000 fit in a message
    doc["slice"]["spec"]["devices"] = [{**device, "name": f"gpu-{i}"} for i in range(devices)]
    doc["slice"]["spec"]["nodeName"], doc["slice"]["spec"]["pool"]["name"] = node, pool
    doc["slice"]["metadata"]["name"] = f"{node}-gpus"
    return ev.subject("inventory", "gpu.nvidia.com", pool, f"{node}-gpus"), json.dumps(doc).encode()


async def test_the_allocator_refuses_a_slice_past_the_limits_or_in_another_nodes_pool(bus: Bus, tmp_path: Path):
    allocator = Service("allocator", ["allocator", "--nats-url", url_of(bus)], {"DRALLOC_ALLOCATOR_LEASE_TTL": "2"}, tmp_path)
    await allocator.start()
    try:
        await bus.publish(claim_event("all", gpus=8))  # the one real node is full
        assert isinstance(await decision(bus, "all"), ev.AllocationCommitted)
        # 6,000 GPUs on a node that does not exist; 8 on a real node, in a pool that is not that node's.
        ghost, foreign = ghost_slice(6_000, node="ghost", pool="ghost"), ghost_slice(8, node="n-0", pool="elsewhere")
        for subject, data in (ghost, foreign):
            await jetstream(bus).publish(subject, data)
        async with asyncio.timeout(15):
            while len(found := await letters(bus)) < 2:
                await asyncio.sleep(0.1)
        assert "spec.devices: at most 128 devices per slice, has 6,000" in found[ghost[0]]
        assert "spec.pool.name 'elsewhere' is not spec.nodeName 'n-0'" in found[foreign[0]]
        for attempt in ("live", "rebuilt"):
            await bus.publish(claim_event(f"more-{attempt}", gpus=1))
            more = await decision(bus, f"more-{attempt}")
            assert isinstance(more, ev.AllocationFailed) and more.reason == "unsatisfiable", (attempt, more)
            await allocator.stop()  # the next term rebuilds from INVENTORY, the refused slices in it
            await allocator.start()
        assert "Traceback" not in logged(tmp_path, "allocator")
    finally:
        await allocator.stop()
