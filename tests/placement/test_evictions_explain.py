"""`dralloc explain` (offline) of a large Pod that does not fit says which Pods the allocator would ask
to evict with moves on (services/allocator/evicting.py `describe`): only Pods a claim is reserved for."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dralloc.cli import app

CLASSES = str(Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml")


def claim(name: str, count: int, node: str, pod: str | None) -> str:
    """A claim allocated on `node` (gpu-0...), reserved for Pod `pod` (None: for nothing)."""
    results = ", ".join(f"{{request: gpu, driver: gpu.nvidia.com, pool: {node}, device: gpu-{i}}}" for i in range(count))
    reserved = f"\n  reservedFor: [{{resource: pods, name: {pod}, uid: uid-{pod}}}]" if pod else ""
    return f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}}}]}}}}
status:
  allocation:
    devices: {{results: [{results}]}}
    nodeSelector: {{nodeSelectorTerms: [{{matchFields: [{{key: metadata.name, operator: In, values: [{node}]}}]}}]}}{reserved}
"""


BIG_POD = """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: eight, namespace: ml}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 8}}]}}}
---
apiVersion: v1
kind: Pod
metadata: {name: big, namespace: ml}
spec:
  containers: [{name: main, image: busybox}]
  resourceClaims: [{name: gpus, resourceClaimTemplateName: eight}]
"""


def notes(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "inputs.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["explain", "-f", CLASSES, "-f", str(path), "--profile", "h100-sxm:2", "-o", "json"])
    (big,) = [e for e in json.loads(result.stdout)["claims"] if e.get("pod") == "ml/big"]
    assert big["status"] == "unsatisfiable"
    return big["explanation"]["notes"]


def test_a_large_pod_that_does_not_fit_names_the_pods_that_would_be_evicted(tmp_path):
    # h100-sxm-0: ml/x (Pod px) holds 6 GPUs; h100-sxm-1: ml/y (Pod py) holds 2: 8 free, no node whole
    found = notes(tmp_path, claim("x", 6, "h100-sxm-0", "px") + claim("y", 2, "h100-sxm-1", "py") + BIG_POD)
    assert found[-1] == (
        "with moves on (DRALLOC_ALLOCATOR_MOVES), the allocator would ask to evict Pod(s) ml/py (claim(s) ml/y; "
        "each restarts elsewhere) to make room on node h100-sxm-1; a PodDisruptionBudget may refuse"
    )


def test_claims_reserved_for_no_pod_are_not_evicted(tmp_path):
    # ml/y is reserved for nothing: the Pod using ml/x is the one to go (ml/x fits in h100-sxm-1's 6 free)
    found = notes(tmp_path, claim("x", 6, "h100-sxm-0", "px") + claim("y", 2, "h100-sxm-1", None) + BIG_POD)
    assert "ask to evict Pod(s) ml/px (claim(s) ml/x; each restarts elsewhere) to make room on node h100-sxm-0" in found[-1]
    found = notes(tmp_path, claim("x", 6, "h100-sxm-0", None) + claim("y", 2, "h100-sxm-1", None) + BIG_POD)
    assert not any("evict" in note for note in found)
