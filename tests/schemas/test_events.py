"""Bus events: wire format, subjects, message ids, refusal of what is not an event."""

from __future__ import annotations

import json
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dralloc.schemas import events as ev
from dralloc.schemas.resource import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimConsumerReference,
    ResourceClaimStatus,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)


def a_claim(uid: str = "u-1", generation: int | None = None) -> ResourceClaim:
    return ResourceClaim(metadata=ObjectMeta(name="train.gpus", namespace="ml", uid=uid, generation=generation))


def allocated(claim: ResourceClaim) -> ResourceClaim:
    result = DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="node-1", device="gpu-0")
    allocation = AllocationResult(devices=DeviceAllocationResult(results=[result]))
    return msgspec.structs.replace(claim, status=ResourceClaimStatus(allocation=allocation))


@pytest.mark.parametrize(
    "event",
    [
        ev.ClaimSubmitted(claim=a_claim()),
        ev.ClaimDeleted(namespace="ml", name="train.gpus", uid="u-1"),
        ev.AllocationCommitted(claim=allocated(a_claim()), node="node-1"),
        ev.AllocationFailed(namespace="ml", name="train.gpus", uid="u-1", generation=1, reason="error", message="bad CEL"),
        ev.AllocationReleased(namespace="ml", name="train.gpus", uid="u-1"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_claim_events_round_trip_and_share_the_claims_subject_token(event: ev.Event):
    wire = ev.encode(event)
    doc = json.loads(wire)
    assert doc["type"] == type(event).__name__ and doc["schemaVersion"] == ev.SCHEMA_VERSION
    assert ev.decode(wire) == event
    assert event.subject.rsplit(".", 2)[1:] == ["ml", "train%2Egpus"]


def test_committed_event_carries_kubernetes_json():
    doc = json.loads(ev.encode(ev.AllocationCommitted(claim=allocated(a_claim()), node="node-1")))
    assert doc["claim"]["status"]["allocation"]["devices"]["results"][0] == {
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0",
    }  # fmt: skip


def test_msg_id_follows_identity_not_instance():
    assert ev.ClaimSubmitted(claim=a_claim()).msg_id == ev.ClaimSubmitted(claim=a_claim()).msg_id
    assert ev.ClaimSubmitted(claim=a_claim()).msg_id != ev.ClaimSubmitted(claim=a_claim(uid="u-2")).msg_id
    assert ev.ClaimSubmitted(claim=a_claim(generation=1)).msg_id != ev.ClaimSubmitted(claim=a_claim(generation=2)).msg_id
    failed = dict(namespace="ml", name="c", uid="u", generation=1, reason="unsatisfiable")
    assert ev.AllocationFailed(**failed, message="no fit").msg_id != ev.AllocationFailed(**failed, message="other").msg_id


def test_slice_subject_encodes_the_driver_reversibly():
    s = ResourceSlice(
        metadata=ObjectMeta(name="node-1-gpu.nvidia.com-abc"),
        spec=ResourceSliceSpec(driver="gpu.nvidia.com", pool=ResourcePool(name="node-1", generation=3, resource_slice_count=1)),
    )
    published = ev.ResourceSlicePublished(slice=s)
    removed = ev.ResourceSliceRemoved(name=s.metadata.name, driver="gpu.nvidia.com", pool="node-1", generation=3)
    assert published.subject == "dra.inventory.gpu%2Envidia%2Ecom.node-1.node-1-gpu%2Envidia%2Ecom-abc"
    assert removed.subject == published.subject  # so the removal replaces the slice in INVENTORY
    tokens = published.subject.split(".")
    assert [ev.decode_token(t) for t in tokens[2:]] == ["gpu.nvidia.com", "node-1", s.metadata.name]


@given(st.text(max_size=40))
def test_token_encoding_is_reversible_and_a_single_valid_token(text: str):
    token = ev.encode_token(text)
    assert token and not any(c in token for c in ".*> \t\r\n")
    assert ev.decode_token(token) == text


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\xff\xfe", "not a dralloc event"),
        (b'{"type":"NoSuchEvent"}', "Invalid value 'NoSuchEvent'"),
        (b'{"type":"ClaimDeleted","namespace":"a"}', "missing required field `name`"),
        (b'{"type":"ClaimDeleted","namespace":"a","name":"b","schemaVersion":2}', "schemaVersion 2"),
        (b"[]", "not a dralloc event"),
    ],
)
def test_decode_refuses_with_a_reason(data: bytes, reason: str):
    with pytest.raises(ev.EventDecodeError, match=reason):
        ev.decode(data)


def test_an_eviction_refusal_round_trips_and_refuses_a_refused_at_that_is_no_time():
    refused = ev.EvictionRefused(namespace="ml", name="c", uid="u1", pod="p", for_namespace="ml", for_pod="big", asked_at=12.5, refused_at=13.25)
    assert ev.decode(ev.encode(refused)) == refused and b'"refusedAt":13.25' in ev.encode(refused)
    for bad, reason in [(b"-1", "refusedAt -1.0 is not a time"), (b"1e999", "Number out of range")]:
        data = ev.encode(refused).replace(b'"refusedAt":13.25', b'"refusedAt":' + bad)
        with pytest.raises(ev.EventDecodeError, match=reason):
            ev.decode(data)


@pytest.mark.parametrize("event", ["EvictionRequested", "EvictionRefused"])
def test_an_eviction_event_refuses_an_asked_at_that_is_no_time(event: str):
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    if event == "EvictionRequested":
        good: ev.Event = ev.EvictionRequested(namespace="ml", name="c", uid="u1", pods=pods, for_namespace="ml", for_pod="big", asked_at=12.5)
    else:
        good = ev.EvictionRefused(namespace="ml", name="c", uid="u1", pod="p", for_namespace="ml", for_pod="big", asked_at=12.5)
    assert ev.decode(ev.encode(good)) == good
    with pytest.raises(ev.EventDecodeError, match=r"askedAt -12.5 is not a time"):
        ev.decode(ev.encode(good).replace(b'"askedAt":12.5', b'"askedAt":-12.5'))


def test_an_eviction_request_counts_the_refusals_before_it_within_bounds():
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    request = ev.EvictionRequested(namespace="ml", name="c", uid="u1", pods=pods, for_namespace="ml", for_pod="big", refused_before=3)
    assert ev.decode(ev.encode(request)) == request and b'"refusedBefore":3' in ev.encode(request)
    for bad, reason in [(b"-1", "refusedBefore -1 is not a count"), (b"65", "refusedBefore 65 is not a count"), (b"1.5", "Expected `int`")]:
        with pytest.raises(ev.EventDecodeError, match=reason):
            ev.decode(ev.encode(request).replace(b'"refusedBefore":3', b'"refusedBefore":' + bad))


def test_an_eviction_for_a_gang_names_the_gang_as_an_object_name():
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    request = ev.EvictionRequested(namespace="ml", name="c", uid="u1", pods=pods, for_namespace="ml", for_pod="g0", gang="job")
    refused = ev.EvictionRefused(namespace="ml", name="c", uid="u1", pod="p", for_namespace="ml", for_pod="g0", gang="job")
    for event in (request, refused):
        assert ev.decode(ev.encode(event)) == event and b'"gang":"job"' in ev.encode(event)
        for bad in ("Job One", "x" * 254, "a/b"):
            with pytest.raises(ev.EventDecodeError, match="gang: "):
                ev.decode(ev.encode(msgspec.structs.replace(event, gang=bad)))


def test_an_eviction_for_a_gang_names_its_pods_as_object_names_within_bounds():
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    request = ev.EvictionRequested(namespace="ml", name="c", uid="u1", pods=pods, for_namespace="ml", for_pod="g0", gang="job", gang_pods=["g0", "g1"])
    assert ev.decode(ev.encode(request)) == request and b'"gangPods":["g0","g1"]' in ev.encode(request)
    for changes, reason in [
        ({"gang": ""}, "gangPods without a gang"),
        ({"gang_pods": ["g0", "G 1"]}, "gangPods: 'G 1' is not"),
        ({"gang_pods": ["g"] * (ev.EVICTION_GANG_PODS_MAX + 1)}, f"gangPods names {ev.EVICTION_GANG_PODS_MAX + 1} Pods"),
    ]:
        with pytest.raises(ev.EventDecodeError, match=re.escape(reason)):
            ev.decode(ev.encode(msgspec.structs.replace(request, **changes)))


def test_an_eviction_is_for_one_pod_or_one_claim_named_as_objects_are():
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    request = ev.EvictionRequested(namespace="ml", name="c", uid="u1", pods=pods, for_namespace="ml", for_pod="", for_claim="batch")
    refused = ev.EvictionRefused(namespace="ml", name="c", uid="u1", pod="p", for_namespace="ml", for_pod="", for_claim="batch")
    for event in (request, refused):
        assert ev.decode(ev.encode(event)) == event and b'"forClaim":"batch"' in ev.encode(event)
        for changes, reason in [
            ({"for_pod": "big"}, "forPod 'big' and forClaim 'batch': room is made for one Pod or one claim"),
            ({"for_claim": ""}, "'' is not"),
            ({"for_claim": "Batch Job"}, "forClaim: 'Batch Job' is not"),
        ]:
            with pytest.raises(ev.EventDecodeError, match=re.escape(reason)):
                ev.decode(ev.encode(msgspec.structs.replace(event, **changes)))
    assert request.msg_id != msgspec.structs.replace(request, for_claim="other").msg_id


def test_an_eviction_request_round_trips_and_refuses_held_devices_no_slice_could_name():
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    held = [ev.HeldDevice(driver="gpu.nvidia.com", pool="node-1", device="gpu-0")]
    request = ev.EvictionRequested(namespace="ml", name="c", uid="u1", pods=pods, for_namespace="ml", for_pod="big", held=held, asked_at=12.5)
    assert ev.decode(ev.encode(request)) == request
    assert b'"askedAt":12.5' in ev.encode(request)
    for bad, reason in [
        (ev.HeldDevice(driver="not a driver", pool="node-1", device="gpu-0"), "held device driver"),
        (ev.HeldDevice(driver="gpu.nvidia.com", pool="node-1", device="GPU 0"), "held device 'GPU 0'"),
        (ev.HeldDevice(driver="gpu.nvidia.com", pool="//", device="gpu-0"), "held device 'gpu-0'"),
    ]:
        with pytest.raises(ev.EventDecodeError, match=reason):
            ev.decode(ev.encode(msgspec.structs.replace(request, held=[bad])))
