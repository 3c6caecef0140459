"""The invariant checker of the pipeline benchmark and the fault tests: it must see every violation."""

from __future__ import annotations

import msgspec
from pipeline import Stored, StreamReader, check, claim_event

from dralloc.bus import StoredMessage
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaimStatus


def submitted(name: str, at: float) -> Stored:
    event = claim_event(name)
    return Stored(0, at, event.subject, event, {})


def committed(seq: int, at: float, claim: Stored, *devices: str) -> Stored:
    allocation = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": d} for d in devices]}}
    status = msgspec.convert({"allocation": allocation}, ResourceClaimStatus)
    event = ev.AllocationCommitted(claim=msgspec.structs.replace(claim.event.claim, status=status))
    return Stored(seq, at, event.subject, event, {})


def released(seq: int, claim: Stored) -> Stored:
    meta = claim.event.claim.metadata
    return Stored(seq, 0, "", ev.AllocationReleased(namespace=meta.namespace, name=meta.name, uid=meta.uid), {})


def test_a_clean_run_has_no_violation_and_its_latencies():
    a, b = submitted("a", 10.0), submitted("b", 10.5)
    verdict = check([a, b], [committed(1, 10.01, a, "gpu-0"), committed(2, 10.52, b, "gpu-1")])
    assert (verdict.submitted, verdict.outcomes, verdict.lost, verdict.duplicated, verdict.double_allocated_devices) == (2, 2, 0, 0, 0)
    assert [round(x) for x in verdict.latencies_ms] == [10, 20]


def test_lost_duplicated_and_double_allocated_are_counted():
    a, b, c = submitted("a", 1), submitted("b", 1), submitted("c", 1)
    verdict = check([a, b, c], [committed(1, 2, a, "gpu-0"), committed(2, 2, b, "gpu-0", "gpu-1"), committed(3, 3, b, "gpu-2")])
    assert verdict.lost == 1  # c
    assert verdict.duplicated == 1  # b twice
    assert [d.split(",")[0] for d in verdict.duplicates[b.event.claim.key]] == ["#2 committed on None", "#3 committed on None"]  # what was written, in words
    assert verdict.double_allocated_devices == 1  # gpu-0 held by a when b got it


def test_a_released_device_may_be_given_again():
    a, b = submitted("a", 1), submitted("b", 1)
    assert check([a, b], [committed(1, 2, a, "gpu-0"), released(2, a), committed(3, 3, b, "gpu-0")]).double_allocated_devices == 0


def test_the_reader_takes_each_stored_message_once() -> None:
    """A reading consumer whose server restarted mid-scan may deliver what it delivered already: the
    same stored message (its sequence) is not a second decision. (Counted twice, one commit read
    `duplicated: 1`.)"""
    a = submitted("a", 1)
    reader = StreamReader(None, "ALLOCATIONS")  # (no bus: only what a scan delivers, fed to it)
    stored = [StoredMessage("ALLOCATIONS", seq, s.subject, ev.encode(s.event), None) for seq, s in ((1, committed(1, 2, a, "gpu-0")), (2, released(2, a)))]
    for msg in (stored[0], stored[0], stored[1], stored[0]):
        reader.take(msg)
    assert [s.seq for s in reader.seen] == [1, 2] and reader.next_seq == 3
    assert check([a], reader.seen).duplicated == 0
