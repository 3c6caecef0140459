"""The four services in-process against a real nats-server: claims in, committed allocations and stored status out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from dralloc import demo
from dralloc.allocator import service as allocator
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_text
from dralloc.schemas import events as ev
from dralloc.statuswriter.sinks import ClaimStatus, read_all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ONE_NODE = [{"profile": "h100-sxm", "count": 1, "prefix": "h100"}]  # 8 GPUs on one NVSwitch


def claims_text(*specs: tuple[str, int, str]) -> str:
    """ResourceClaims (name, count, extra CEL) in namespace ml, class gpu.nvidia.com."""
    docs = []
    for name, count, cel in specs:
        selectors = f"\n        selectors:\n        - cel: {{expression: {cel!r}}}" if cel else ""
        docs.append(
            f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.nvidia.com
        count: {count}{selectors}
"""
        )
    return "---\n".join(docs)


def submitted(text: str) -> list[ev.ClaimSubmitted]:
    return [e for e in events_from_manifests(load_text(text, "test.yaml"), print) if isinstance(e, ev.ClaimSubmitted)]


async def decisions(bus: Bus) -> list[ev.Event]:
    """Every event in ALLOCATIONS, in order."""
    found = []
    for seq in range(1, (await bus.stream_state("ALLOCATIONS")).last_sequence + 1):
        found.append(ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data))
    return found


async def wait_for_store(bus: Bus, done, timeout: float = 15.0) -> dict[str, ClaimStatus]:
    kv = await bus.key_value("dralloc-claims")
    async with asyncio.timeout(timeout):
        while True:
            statuses = {s.claim: s for s in await read_all(kv)}
            if done(statuses):
                return statuses
            await asyncio.sleep(0.05)


def devices_of(status: ClaimStatus) -> set[tuple[str, str, str]]:
    return {(r.driver, r.pool, r.device) for r in status.allocation.devices.results}


async def test_examples_flow_through_all_four_services(bus: Bus, nats_url: str):
    expected = demo.expected_claims([str(EXAMPLES)])
    assert len(expected) >= 6
    async with demo.running(nats_url, paths=[str(EXAMPLES)]):
        statuses = await wait_for_store(bus, lambda s: all(s.get(k) and s[k].state == "allocated" for k in expected))

    committed = [e for e in await decisions(bus) if isinstance(e, ev.AllocationCommitted)]
    assert sorted({e.key for e in committed}) == sorted(expected)
    for event in committed:  # the stored status is the committed decision
        assert statuses[event.key].allocation == event.allocation and statuses[event.key].node == event.node
    # No device is handed out twice, and each claim got the count it asked for, on one node.
    all_devices = [d for s in statuses.values() for d in devices_of(s)]
    assert len(all_devices) == len(set(all_devices))
    pretrain = next(s for k, s in statuses.items() if k.startswith("team-b/llm-pretrain-0-gpus-"))
    assert len(devices_of(pretrain)) == 8 and {pool for _, pool, _ in devices_of(pretrain)} == {pretrain.node}
    l40s = statuses["inference/l40s-inference"]
    assert l40s.node.startswith("l40s-")


async def test_bad_claims_fail_clearly_and_the_rest_is_allocated(bus: Bus, nats_url: str, tmp_path: Path):
    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    (tmp_path / "claims.yaml").write_text(
        claims_text(("bad-cel", 1, "device.attributes['gpu.nvidia.com'].productName ==")) + "---\n"
        + claims_text(("fine", 2, "")) + "---\n"
        + claims_text(("too-many", 9, ""))
        + """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: no-class, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: does-not-exist}
"""
    )  # fmt: skip
    await jetstream(bus).publish("dra.claims.ml.garbage", b"{not an event")  # undecodable: dead-lettered
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=ONE_NODE):
        names = ("ml/bad-cel", "ml/fine", "ml/too-many", "ml/no-class")
        statuses = await wait_for_store(bus, lambda s: all(n in s for n in names) and s["ml/fine"].state == "allocated")

    assert statuses["ml/bad-cel"].state == "error"
    assert "gpus" in statuses["ml/bad-cel"].message and "CEL" in statuses["ml/bad-cel"].message
    assert statuses["ml/no-class"].state == "error" and "does-not-exist" in statuses["ml/no-class"].message
    assert statuses["ml/too-many"].state == "unsatisfiable" and statuses["ml/too-many"].message
    assert len(devices_of(statuses["ml/fine"])) == 2
    letter = await jetstream(bus).get_msg("DEADLETTER", seq=1)
    assert letter.headers["Dralloc-Subject"] == "dra.claims.ml.garbage"
    assert letter.subject == "dra.deadletter.CLAIMS.allocator"


async def wait_for_inventory(bus: Bus, classes: int = 2) -> None:
    async with asyncio.timeout(10):
        while True:
            replayed, _ = await bus.replay("INVENTORY")
            kinds = [type(e) for e in replayed]
            if kinds.count(ev.DeviceClassPublished) >= classes and ev.ResourceSlicePublished in kinds:
                return
            await asyncio.sleep(0.05)


async def test_redelivered_claim_is_not_allocated_twice(bus: Bus, nats_url: str, tmp_path: Path):
    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    first, second = submitted(claims_text(("first", 4, ""), ("second", 4, "")))
    without_allocator = ("discovery", "statuswriter", "ingestor")
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=ONE_NODE, services=without_allocator):
        await wait_for_inventory(bus)
        await bus.publish(first)
        # An allocator commits `first` and dies before acking it: the decision is on the bus,
        # the claim is still unacked in CLAIMS.
        async with await Bus.connect(nats_url, name="doomed") as doomed_bus:
            doomed = allocator.Allocator(doomed_bus)
            await doomed.rebuild()
            await doomed.on_claim(first)
        await bus.publish(second)
        # Its successor rebuilds the ledger from ALLOCATIONS and gets `first` delivered again.
        stop = asyncio.Event()
        successor = asyncio.create_task(allocator.serve(bus, allocator.Config(), stop))
        statuses = await wait_for_store(bus, lambda s: all(k in s and s[k].state == "allocated" for k in ("ml/first", "ml/second")))
        async with asyncio.timeout(10):  # ...and acks it
            while (info := await jetstream(bus).consumer_info("CLAIMS", "allocator")).num_ack_pending or info.num_pending:
                await asyncio.sleep(0.05)
        stop.set()
        await successor

    commits = [e for e in await decisions(bus) if isinstance(e, ev.AllocationCommitted)]
    assert [e.key for e in commits] == ["ml/first", "ml/second"]  # one commit each, never two for `first`
    assert not devices_of(statuses["ml/first"]) & devices_of(statuses["ml/second"])


async def test_restarted_allocator_rebuilds_its_ledger_and_retries_waiting_claims(bus: Bus, nats_url: str, tmp_path: Path):
    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    whole, more = submitted(claims_text(("whole-node", 8, ""), ("one-more", 1, "")))
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=ONE_NODE):
        await bus.publish(whole)
        await wait_for_store(bus, lambda s: "ml/whole-node" in s and s["ml/whole-node"].state == "allocated")
    # Everything stopped (discovery withdrew its slices). A new system: the ledger comes from ALLOCATIONS.
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=ONE_NODE):
        await bus.publish(more)
        statuses = await wait_for_store(bus, lambda s: "ml/one-more" in s)
        await asyncio.sleep(0.5)  # a retry after the inventory settles must not find room either
        statuses = await wait_for_store(bus, lambda s: True)
        assert statuses["ml/one-more"].state == "unsatisfiable"
        # Deleting the big claim frees the node: the waiting claim is retried and fits.
        await bus.publish(ev.ClaimDeleted(namespace="ml", name="whole-node", uid=whole.claim.metadata.uid))
        statuses = await wait_for_store(bus, lambda s: "ml/whole-node" not in s and s["ml/one-more"].state == "allocated")
    released = [e for e in await decisions(bus) if isinstance(e, ev.AllocationReleased)]
    assert [e.key for e in released] == ["ml/whole-node"]
    assert msgspec.json.decode(msgspec.json.encode(statuses["ml/one-more"].allocation))["devices"]["results"]


async def test_a_claim_that_arrives_allocated_is_adopted_not_decided_again(bus: Bus, nats_url: str, tmp_path: Path):
    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    results = "\n".join(f"        - {{request: gpus, driver: gpu.nvidia.com, pool: h100-0, device: gpu-{i}}}" for i in (7, 6, 5, 4))
    existing = (
        claims_text(("running-job", 4, ""))
        + f"""status:
  allocation:
    devices:
      results:
{results}
    nodeSelector:
      nodeSelectorTerms:
      - matchFields: [{{key: metadata.name, operator: In, values: [h100-0]}}]
"""
    )
    (tmp_path / "existing.yaml").write_text(existing)
    whole, half = submitted(claims_text(("whole-node", 8, ""), ("other-half", 4, "")))
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=ONE_NODE):
        statuses = await wait_for_store(bus, lambda s: "ml/running-job" in s)
        adopted = statuses["ml/running-job"]
        assert adopted.state == "allocated" and adopted.node == "h100-0"
        # Its devices as written (not what first-fit would have picked), in the same order.
        assert [r.device for r in adopted.allocation.devices.results] == ["gpu-7", "gpu-6", "gpu-5", "gpu-4"]
        await bus.publish(whole)
        await bus.publish(half)
        statuses = await wait_for_store(bus, lambda s: "ml/whole-node" in s and "ml/other-half" in s and s["ml/other-half"].state == "allocated")
    assert statuses["ml/whole-node"].state == "unsatisfiable"
    assert {d for _, _, d in devices_of(statuses["ml/other-half"])} == {f"gpu-{i}" for i in range(4)}
