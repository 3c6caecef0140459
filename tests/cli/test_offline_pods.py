"""`dralloc allocate` on Pods, workloads and ResourceClaimTemplates, with simulated nodes (CLI-CONTRACT.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dralloc.cli import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CLASSES = EXAMPLES / "deviceclasses.yaml"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def results(*args: str) -> tuple[int, list[dict]]:
    result = invoke("allocate", *args, "-o", "json")
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)["results"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "workload.yaml"
    path.write_text(text)
    return str(path)


TEMPLATE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: four-h100, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, count: 4}
      constraints:
      - {requests: [gpus], matchAttribute: dralloc.dev/nvlinkDomain}
---
"""


def test_examples_without_nodes_say_how_to_get_some():
    code, entries = results("-f", str(EXAMPLES))
    assert code == 1
    assert entries and all(e["status"] == "unsatisfiable" for e in entries)
    assert all("add --profile h100-sxm:4 or --fleet FILE" in e["message"] for e in entries)


def test_examples_on_profiles_allocate_everything_pods_included():
    code, entries = results("-f", str(EXAMPLES), "--profile", "h100-sxm:4", "--profile", "l40s-pcie:2")
    assert code == 0, entries
    by_claim = {e["claim"]: e for e in entries}
    pod_claim = by_claim["team-b/llm-pretrain-0-gpus"]
    assert pod_claim["pod"] == "team-b/llm-pretrain-0"
    assert pod_claim["node"].startswith("h100-sxm-")
    assert len(pod_claim["allocation"]["devices"]["results"]) == 8
    assert "pod" not in by_claim["team-a/h100-nvlink-pair"]


def test_the_article_pod_gets_two_nvlink_gpus(shared_dir):
    code, entries = results("-f", str(EXAMPLES / "article-h100-nvlink.yaml"), "-f", str(CLASSES), "--profile", "h100-sxm")
    assert code == 0
    (entry,) = entries
    assert entry["claim"] == "default/deep-learning-inference-gpu-claim"
    assert entry["pod"] == "default/deep-learning-inference"
    assert [r["device"] for r in entry["allocation"]["devices"]["results"]] == ["gpu-0", "gpu-1"]


def test_a_deployment_stands_for_its_replicas_each_pod_one_unit(tmp_path):
    text = (
        TEMPLATE
        + """
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: ml}
spec:
  replicas: 3
  template:
    spec:
      containers: [{name: trainer, resources: {claims: [{name: gpus}]}}]
      resourceClaims: [{name: gpus, resourceClaimTemplateName: four-h100}]
"""
    )
    code, entries = results("-f", write(tmp_path, text), "-f", str(CLASSES), "--profile", "h100-sxm:1")
    # one node of 8 GPUs: two replicas fit (one NVLink domain each half), the third does not
    assert code == 1
    assert [(e["claim"], e["pod"], e["status"]) for e in entries] == [
        ("ml/train-0-gpus", "ml/train-0", "allocated"),
        ("ml/train-1-gpus", "ml/train-1", "allocated"),
        ("ml/train-2-gpus", "ml/train-2", "unsatisfiable"),
    ]
    used = [r["device"] for e in entries[:2] for r in e["allocation"]["devices"]["results"]]
    assert len(set(used)) == 8


def test_a_job_with_extended_resources_and_a_named_claim_is_one_unit_on_one_node(tmp_path):
    text = (
        TEMPLATE
        + """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: whole-gpu}
spec:
  extendedResourceName: nvidia.com/gpu
  selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic.dralloc.dev}
spec: {selectors: [{cel: {expression: "device.driver == 'dra.net'"}}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: scratch-nic, namespace: ml}
spec:
  devices:
    requests: [{name: nic, exactly: {deviceClassName: nic.dralloc.dev}}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: finetune, namespace: ml}
spec:
  parallelism: 1
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        resources: {limits: {nvidia.com/gpu: 2}}
      resourceClaims:
      - {name: gpus, resourceClaimTemplateName: four-h100}
      - {name: nic, resourceClaimName: scratch-nic}
"""
    )
    code, entries = results("-f", write(tmp_path, text), "-f", str(CLASSES), "--profile", "h100-sxm:2")
    assert code == 0, entries
    assert [e["claim"] for e in entries] == ["ml/finetune-0-gpus", "ml/finetune-0-extended-resources", "ml/scratch-nic"]
    assert {e["pod"] for e in entries} == {"ml/finetune-0"}
    assert len({e["node"] for e in entries}) == 1  # one Pod, one node
    extended = entries[1]["allocation"]["devices"]["results"]
    assert [r["request"] for r in extended] == ["container-0-request-0", "container-0-request-0"]
    devices = [r["device"] for e in entries[:2] for r in e["allocation"]["devices"]["results"]]
    assert len(devices) == len(set(devices)) == 6


def test_a_pod_that_cannot_fit_whole_takes_nothing(tmp_path):
    text = (
        TEMPLATE
        + """
apiVersion: v1
kind: Pod
metadata: {name: greedy, namespace: ml}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 5}}}]
  resourceClaims: [{name: gpus, resourceClaimTemplateName: four-h100}]
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: whole-gpu}
spec: {extendedResourceName: nvidia.com/gpu, selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com'"}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: small, namespace: ml}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 8}}}]
"""
    )
    code, entries = results("-f", write(tmp_path, text), "-f", str(CLASSES), "--profile", "h100-sxm:1")
    assert code == 1
    statuses = {e["claim"]: e["status"] for e in entries}
    # 4 + 5 GPUs do not fit on an 8-GPU node: neither claim of `greedy` holds anything,
    # so the 8 GPUs are all free for `small`.
    assert statuses == {"ml/greedy-gpus": "unsatisfiable", "ml/greedy-extended-resources": "unsatisfiable", "ml/small-extended-resources": "allocated"}


def test_pod_errors_have_rows_and_bad_workloads_exit_2(tmp_path):
    text = """
apiVersion: v1
kind: Pod
metadata: {name: orphan, namespace: ml}
spec:
  containers: [{name: c}]
  resourceClaims:
  - {name: gpus, resourceClaimTemplateName: missing}
  - {name: shared, resourceClaimName: nowhere}
"""
    code, entries = results("-f", write(tmp_path, text), "--profile", "h100-sxm")
    assert code == 1
    assert [(e["claim"], e["status"]) for e in entries] == [("ml/orphan-gpus", "error"), ("ml/orphan-shared", "error")]
    assert "ResourceClaimTemplate ml/missing not found" in entries[0]["message"]
    bad = write(tmp_path, "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec: {replicas: lots, template: {}}\n")
    result = invoke("allocate", "-f", bad, "-o", "json")
    assert result.exit_code == 2 and result.stdout == ""
    assert "StatefulSet/db: field spec.replicas: expected an integer, got str" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "h100"], "unknown profile 'h100' (did you mean h100-sxm?)"),
        (["--profile", "h100-sxm:0"], "COUNT must be a whole number from 1"),
        (["--profile", "h100-sxm:x"], "COUNT must be a whole number from 1"),
        (["--fleet", "/nonexistent/fleet.yaml"], "cannot read"),
    ],
)
def test_bad_simulated_nodes_exit_2(args, message):
    result = invoke("allocate", "-f", str(CLASSES), *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_fleet_file_and_profile_add_up(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {profile: l40s-pcie, count: 1, prefix: infer}\n")
    claim = tmp_path / "claim.yaml"
    claim.write_text("""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: all-gpus}
spec:
  devices:
    requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}}]
""")
    code, (entry,) = results("-f", str(claim), "-f", str(CLASSES), "--fleet", str(fleet), "--profile", "h100-sxm", "--node", "infer-0")
    assert code == 0 and entry["node"] == "infer-0"
    clash = invoke("allocate", "-f", str(claim), "--fleet", str(fleet), "--profile", "l40s-pcie")
    assert clash.exit_code == 0 or "named twice" not in clash.stderr  # distinct prefixes do not clash
    fleet.write_text("- {profile: l40s-pcie, count: 1}\n")
    clash = invoke("allocate", "-f", str(claim), "--fleet", str(fleet), "--profile", "l40s-pcie")
    assert clash.exit_code == 2 and "l40s-pcie-0 is named twice" in clash.stderr
