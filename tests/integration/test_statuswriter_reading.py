"""The local store's writer reads a commit as only what its record is made of (`statuswriter.reading`):
the same record as from the whole event, and every message it does not take refused as before."""

from __future__ import annotations

import json

import msgspec
import pytest

from dralloc.bus import decode_event
from dralloc.schemas import events as ev
from dralloc.schemas.resource import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
    ResourceClaimStatus,
)
from dralloc.schemas.status import status_of
from dralloc.statuswriter.reading import Committed, read_decision

CLAIM = {
    "metadata": {"name": "train-1", "namespace": "ml", "uid": "u-1", "generation": 2, "labels": {"team": "a"}},
    "spec": {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": [{"cel": {"expression": "true"}}]}}]}
    },
}


def commit(claim: dict | None = None) -> ev.AllocationCommitted:
    results = [DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="node-7", device=f"gpu-{i}") for i in range(2)]
    selector = NodeSelector(
        node_selector_terms=[NodeSelectorTerm(match_fields=[NodeSelectorRequirement(key="metadata.name", operator="In", values=["node-7"])])]
    )
    allocation = AllocationResult(devices=DeviceAllocationResult(results=results), node_selector=selector)
    base = msgspec.convert(claim or CLAIM, ResourceClaim)
    return ev.AllocationCommitted(claim=msgspec.structs.replace(base, status=ResourceClaimStatus(allocation=allocation)), node="node-7")


def record_without_time(event) -> dict:
    record = msgspec.to_builtins(status_of(event))
    record.pop("updated")
    return record


@pytest.mark.parametrize("namespace", ["ml", None])
def test_a_commit_read_in_part_makes_the_record_the_whole_event_makes(namespace):
    event = commit({**CLAIM, "metadata": {**CLAIM["metadata"], "namespace": namespace}})
    read = read_decision("ALLOCATIONS", event.subject, ev.encode(event))
    assert isinstance(read, Committed)  # (the partial reader took it)
    assert record_without_time(read) == record_without_time(event)
    assert (read.key, read.uid, read.node, read.subject) == (event.key, event.uid, event.node, event.subject)


def test_failures_and_releases_are_read_whole():
    failed = ev.AllocationFailed(namespace="ml", name="a", uid="u", generation=1, reason="unsatisfiable", message="no fit")
    released = ev.AllocationReleased(namespace="ml", name="a", uid="u")
    for event in (failed, released):
        assert read_decision("ALLOCATIONS", event.subject, ev.encode(event)) == event


def refusals(data: bytes, subject: str) -> tuple[str, str]:
    """The reasons `read_decision` and the whole decode give for refusing a message."""
    with pytest.raises(ev.EventDecodeError) as partly:
        read_decision("ALLOCATIONS", subject, data)
    with pytest.raises(ev.EventDecodeError) as whole:
        decode_event("ALLOCATIONS", subject, data)
    return str(partly.value), str(whole.value)


def mutated(change) -> bytes:
    doc = json.loads(ev.encode(commit()))
    change(doc)
    return json.dumps(doc, separators=(",", ":")).encode()


SUBJECT = commit().subject


@pytest.mark.parametrize(
    "data, subject, reason",
    [
        (mutated(lambda d: d["claim"]["metadata"].update(name="Bad Name")), "dra.allocations.ml.Bad%20Name", "is not a DNS subdomain"),
        (mutated(lambda d: d["claim"]["metadata"].update(namespace="no.dots")), "dra.allocations.no%2Edots.train-1", "namespace"),
        (mutated(lambda d: d.update(schemaVersion=9)), SUBJECT, "schemaVersion 9"),
        (mutated(lambda d: d["claim"]["metadata"]["labels"].update(team="[" * 150 + "]" * 150)), SUBJECT, None),  # inside a string: not nesting
        (mutated(lambda d: d["claim"]["status"]["allocation"]["devices"]["results"][0].update(device=7)), SUBJECT, "Expected `str`"),
        (mutated(lambda d: d.update(node=["n"])), SUBJECT, "Expected `str | null`"),
        (ev.encode(commit()), "dra.allocations.ml.someone-else", "names another object"),
        (ev.encode(ev.ClaimDeleted(namespace="ml", name="train-1", uid="u")), "dra.claims.ml.train-1", "does not belong in ALLOCATIONS"),
        (b'{"type":"AllocationCommitted","claim":' + b"[" * 200 + b"]" * 200 + b"}", SUBJECT, "nested more than 100 levels deep"),
        (ev.encode(commit()).replace(b'"generation":2', b'"generation":' + b"9" * 30), SUBJECT, "an integer of 30 digits"),
    ],
)
def test_what_the_partial_reader_does_not_take_is_refused_with_the_whole_decodes_reason(data: bytes, subject: str, reason: str | None):
    if reason is None:  # brackets in a string are text: both read it
        assert isinstance(read_decision("ALLOCATIONS", subject, data), Committed)
        assert isinstance(decode_event("ALLOCATIONS", subject, data), ev.AllocationCommitted)
        return
    partly, whole = refusals(data, subject)
    assert partly == whole and reason in partly


@pytest.mark.parametrize(
    "change",
    [lambda d: d["claim"]["spec"]["devices"].update(requests="not a list"), lambda d: d["claim"]["metadata"].update(labels={"x": [[]]})],
)
def test_a_commit_whose_unused_parts_are_malformed_is_still_recorded_from_its_checked_parts(change):
    data = mutated(change)
    with pytest.raises(ev.EventDecodeError):
        decode_event("ALLOCATIONS", SUBJECT, data)  # the allocator would never have written it
    read = read_decision("ALLOCATIONS", SUBJECT, data)
    assert isinstance(read, Committed) and record_without_time(read) == record_without_time(commit())
