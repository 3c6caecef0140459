"""The CLI against hostile input, as users run it (a real nats-server, `dralloc` as a process):
one bad record never breaks `dralloc get claims`; `dralloc submit` refuses deep nesting, absurd
integers and names the API server refuses, names each, and publishes the rest."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec

from dralloc.bus import Bus
from dralloc.statuswriter.sinks import ClaimStatus

DRALLOC = str(Path(sys.executable).parent / "dralloc")


def dralloc(*args: str, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NATS_URL": url}
    return subprocess.run([DRALLOC, *args], env=env, capture_output=True, text=True, timeout=60)


async def test_get_claims_skips_each_bad_record_names_it_and_lists_the_rest(bus: Bus, nats_url: str):
    kv = await bus.key_value("dralloc-claims")
    await kv.put("ml/good", msgspec.json.encode(ClaimStatus(claim="ml/good", uid="u", state="unsatisfiable", message="no room")))
    await kv.put("ml/broken", b"{not json")
    await kv.put("ml/deep", b'{"claim": "ml/deep", "uid": "u", "state": "error", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}")
    await kv.put("ml/alien", msgspec.json.encode(ClaimStatus(claim="other/x", uid="u", state="error")))
    await kv.put("ml/big", b'{"claim": "ml/big", "uid": "u", "state": "error", "n": ' + b"9" * 400 + b"}")

    out = await asyncio.to_thread(dralloc, "get", "claims", "-o", "json", url=nats_url)
    assert out.returncode == 0, out.stderr
    assert [c["claim"] for c in json.loads(out.stdout)["claims"]] == ["ml/good"]
    warnings = sorted(out.stderr.strip().splitlines())
    assert len(warnings) == 4, out.stderr
    assert warnings[0] == "warning: skipped record 'ml/alien': stored under that key but about claim 'other/x'"
    assert warnings[1] == "warning: skipped record 'ml/big': an integer of 400 digits, outside the 64-bit range every integer field has"
    assert warnings[2].startswith("warning: skipped record 'ml/broken': not a claim status: ")
    assert warnings[3] == "warning: skipped record 'ml/deep': nested more than 100 levels deep"

    table = await asyncio.to_thread(dralloc, "get", "claims", url=nats_url)
    assert table.returncode == 0 and "ml/good" in table.stdout and "Traceback" not in table.stderr


CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  devices:
    requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com}}}}]
    config: [{{opaque: {{driver: gpu.nvidia.com, parameters: {parameters}}}}}]
"""


async def test_submit_refuses_poison_and_bad_names_with_a_reason_each_and_publishes_the_rest(bus: Bus, nats_url: str, tmp_path: Path):
    claim = lambda name, namespace="ml", parameters="{a: 1}": CLAIM.format(name=name, namespace=namespace, parameters=parameters)  # noqa: E731
    (tmp_path / "a-good.yaml").write_text(claim("good"))
    (tmp_path / "b-deep.json").write_text(claim("deep", parameters="[" * 990 + "]" * 990))
    (tmp_path / "c-names.yaml").write_text(
        "---\n".join([claim('"has space"'), claim('"tab\\there"'), claim('"star*"'), claim('"gt>"'), claim('"pct%"'),
                      claim('"nul\\0"'), claim("c", namespace='"team-a/b"'), claim('"b/c"', namespace="team-a")])
    )  # fmt: skip
    out = await asyncio.to_thread(dralloc, "submit", "-f", str(tmp_path), "-o", "json", url=nats_url)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    problems = out.stderr.strip().splitlines()
    assert len(problems) == 9, out.stderr
    assert problems[0].startswith(f"dralloc: {tmp_path / 'b-deep.json'} (document 1): ResourceClaim/deep: spec.devices.config.0.opaque.parameters.")
    assert problems[0].endswith("nested more than 100 levels deep")
    names = ["has space", "tab\there", "star*", "gt>", "pct%", "nul\x00"]
    for i, name in enumerate(names):
        assert problems[i + 1].startswith(
            f"dralloc: {tmp_path / 'c-names.yaml'} (document {i + 1}): ResourceClaim/{name}: field metadata.name: {name!r} is not a DNS subdomain"
        )
    assert "field metadata.namespace: 'team-a/b' is not a DNS label" in problems[7]
    assert "field metadata.name: 'b/c' is not a DNS subdomain" in problems[8]
    published = json.loads(out.stdout)["published"]
    assert [p["object"] for p in published] == ["ResourceClaim/ml/good"]
    assert (await bus.stream_state("CLAIMS")).messages == 1


def test_a_claim_made_from_a_pods_template_with_a_name_the_api_server_refuses_is_reported_not_published():
    from dralloc.ingestor.sources import events_from_manifests
    from dralloc.manifests import load_text

    text = """apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t, namespace: ml}
spec:
  spec:
    devices:
      requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: ml}
spec:
  resourceClaims: [{name: "My GPUs", resourceClaimTemplateName: t}, {name: gpus, resourceClaimTemplateName: t}]
"""
    reports: list[str] = []
    made = [e.claim.metadata.name for e in events_from_manifests(load_text(text, "pod.yaml"), reports.append)]
    assert len(made) == 1 and made[0].startswith("trainer-gpus-")
    (report,) = reports
    assert report.startswith("pod.yaml (document 2): Pod/trainer: its claim is not published: metadata.name: 'trainer-My GPUs-")
