"""The ingestor's pure parts (template expansion, manifests to events, change detection) and its bus shell."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from dralloc.bus import Bus
from dralloc.ingestor import service as ingestor
from dralloc.ingestor.sources import FileSource
from dralloc.manifest_events import changes, events_from_manifests, with_identity
from dralloc.manifests import load_paths, load_text
from dralloc.pods import POD_CLAIM_NAME_ANNOTATION, generate_name
from dralloc.schemas import events as ev

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TEMPLATE_AND_POD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus, namespace: ml, labels: {team: ml}, annotations: {note: x}}
spec:
  metadata: {labels: {team: ml}, annotations: {note: x}}
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, count: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: ml, uid: pod-uid-1}
spec:
  resourceClaims:
  - {name: gpus, resourceClaimTemplateName: two-gpus}
  - {name: shared, resourceClaimName: existing-claim}
  - {name: lost, resourceClaimTemplateName: no-such-template}
"""


def test_pod_claims_are_expanded_as_the_claim_controller_does():
    manifests = load_text(TEMPLATE_AND_POD, "pod.yaml")
    problems: list[str] = []
    events = events_from_manifests(manifests, problems.append)
    (submitted,) = events
    claim = submitted.claim
    assert claim.metadata.generate_name == "trainer-gpus-"
    assert claim.metadata.name.startswith("trainer-gpus-") and len(claim.metadata.name) == len("trainer-gpus-") + 5
    assert set(claim.metadata.name[-5:]) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert claim.metadata.namespace == "ml"
    assert claim.metadata.annotations == {"note": "x", POD_CLAIM_NAME_ANNOTATION: "gpus"}
    assert claim.metadata.labels == {"team": "ml"}
    (owner,) = claim.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == ("Pod", "trainer", "pod-uid-1", True, True)
    assert claim.spec.devices.requests[0].exactly.count == 2
    assert claim.metadata.uid  # files carry no uid: one is derived
    assert problems == [
        "pod.yaml (document 2): Pod/trainer: field spec.resourceClaims[2].resourceClaimTemplateName: ResourceClaimTemplate ml/no-such-template not found"
    ]
    # Reading the same Pod again names the same claim (no duplicate allocation).
    assert events_from_manifests(load_text(TEMPLATE_AND_POD, "pod.yaml"), lambda _: None) == events


def test_long_names_are_cut_in_proportion():
    pod_name, claim_name = "p" * 60, "c" * 30
    name = generate_name(pod_name, claim_name)
    # 91 characters over the 57 allowed: each part keeps len * 57 // 92.
    assert name == "p" * (60 * 57 // 92) + "-" + "c" * (30 * 57 // 92)
    assert generate_name("pod", "gpu") == "pod-gpu-"


def test_bad_input_is_reported_per_object_and_the_rest_is_used(tmp_path: Path):
    (tmp_path / "a-broken.yaml").write_text("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: x\n")
    (tmp_path / "b-mixed.yaml").write_text(
        """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: wrong-type, namespace: ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com, count: two}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: fine, namespace: ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""
    )
    problems: list[str] = []
    events = events_from_manifests(load_paths([tmp_path]), problems.append)
    assert [e.claim.key for e in events] == ["ns/fine"]
    assert len(problems) == 2
    assert problems[0].startswith(f"{tmp_path / 'a-broken.yaml'} (document 1): invalid YAML at line")
    assert problems[1] == (
        f"{tmp_path / 'b-mixed.yaml'} (document 1): ResourceClaim/wrong-type: field spec.devices.requests[0].exactly.count: Expected `int | null`, got `str`"
    )


def test_changes_remove_what_disappeared_and_replace_changed_claims():
    first = events_from_manifests(load_paths([EXAMPLES]), lambda _: None)
    todo, state = changes({}, first)
    assert todo == first
    again, state = changes(state, first)
    assert again == []
    # One claim gone, one claim's spec changed (a new object in Kubernetes terms).
    claims = [e for e in first if isinstance(e, ev.ClaimSubmitted)]
    gone, changed = claims[0], claims[1]
    spec = msgspec.structs.replace(changed.claim.spec.devices.requests[0].exactly, count=3)
    request = msgspec.structs.replace(changed.claim.spec.devices.requests[0], exactly=spec)
    devices = msgspec.structs.replace(changed.claim.spec.devices, requests=[request])
    new_claim = msgspec.structs.replace(changed.claim, spec=msgspec.structs.replace(changed.claim.spec, devices=devices))
    new_claim = with_identity(msgspec.structs.replace(new_claim, metadata=msgspec.structs.replace(new_claim.metadata, uid=None)))
    current = [e for e in first if e is not gone and e is not changed] + [ev.ClaimSubmitted(claim=new_claim)]
    todo, _ = changes(state, current)
    assert [type(e).__name__ for e in todo] == ["ClaimDeleted", "ClaimDeleted", "ClaimSubmitted"]
    assert todo[0].key == gone.claim.key
    assert (todo[1].key, todo[1].uid) == (changed.claim.key, changed.claim.metadata.uid)
    assert todo[2].claim.metadata.uid != changed.claim.metadata.uid


async def test_ingestor_publishes_examples_once(bus: Bus):
    config = ingestor.Config(paths=[str(EXAMPLES)])
    await ingestor.serve(bus, config, asyncio.Event())
    claims, _ = await bus.replay("CLAIMS")
    expected = [e for e in events_from_manifests(load_paths([EXAMPLES]), lambda _: None) if isinstance(e, ev.ClaimSubmitted)]
    assert sorted(e.claim.key for e in claims) == sorted(e.claim.key for e in expected)
    classes, _ = await bus.replay("INVENTORY", "dra.deviceclasses.>")
    assert {e.device_class.metadata.name for e in classes} >= {"gpu.nvidia.com"}
    # Running it again publishes nothing new: every event is deduplicated by its identity.
    before = (await bus.stream_state("CLAIMS")).messages
    await ingestor.serve(bus, config, asyncio.Event())
    assert (await bus.stream_state("CLAIMS")).messages == before


async def test_watching_file_source_sees_a_deleted_file(tmp_path: Path):
    claim = (EXAMPLES / "single-gpu.yaml").read_text()
    (tmp_path / "c.yaml").write_text(claim)
    stop = asyncio.Event()
    source = FileSource([str(tmp_path)], report=lambda _: None, watch=True, interval=0.05)
    seen: list[ev.Event] = []

    async def collect():
        async for event in source.events(stop):
            seen.append(event)

    task = asyncio.create_task(collect())
    async with asyncio.timeout(5):
        while not seen:
            await asyncio.sleep(0.02)
        (tmp_path / "c.yaml").unlink()
        while len(seen) < 2:
            await asyncio.sleep(0.02)
    stop.set()
    await task
    assert [type(e).__name__ for e in seen] == ["ClaimSubmitted", "ClaimDeleted"]
    assert seen[1].uid == seen[0].claim.metadata.uid


def test_objects_the_api_server_would_refuse_are_reported_not_published():
    text = """apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: Bad_Name
        exactly: {deviceClassName: gpu.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  resourceClaims:
  - {name: gpus, resourceClaimTemplateName: t}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com, count: 2}
    constraints:
    - {matchAttribute: nvlinkDomain}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: ok, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""
    problems: list[str] = []
    events = events_from_manifests(load_text(text, "x.yaml"), problems.append)
    assert [e.claim.key for e in events] == ["ml/ok"]
    assert problems == [
        "x.yaml (document 1): ResourceClaimTemplate/t: field spec.spec.devices.requests[0].name: 'Bad_Name' must be a DNS label",
        "x.yaml (document 2): Pod/p: field spec.resourceClaims[0].resourceClaimTemplateName: "
        "ResourceClaimTemplate ml/t is invalid (see its own error); no claim made",
        "x.yaml (document 3): ResourceClaim/c: field spec.devices.constraints[0].matchAttribute: "
        "'nvlinkDomain' must be fully qualified (domain/name), e.g. gpu.nvidia.com/nvlinkDomain",
    ]
