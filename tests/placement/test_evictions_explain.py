"""`dralloc explain` (offline) of a large Pod that does not fit says which Pods the allocator would ask
to evict with moves on (services/allocator/evicting.py `describe`): only Pods a claim is reserved for."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dralloc.cli import app

CLASSES = str(Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml")


def claim(name: str, count: int, node: str, pod: str | None, first: int = 0) -> str:
    """A claim allocated on `node` (gpu-`first`...), reserved for Pod `pod` (None: for nothing)."""
    results = ", ".join(f"{{request: gpu, driver: gpu.nvidia.com, pool: {node}, device: gpu-{i}}}" for i in range(first, first + count))
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


def explained(tmp_path: Path, text: str, nodes: int = 2) -> dict[str, dict]:
    """`dralloc explain -o json` of `text` over `nodes` H100 nodes: claim key -> its entry."""
    path = tmp_path / "inputs.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["explain", "-f", CLASSES, "-f", str(path), "--profile", f"h100-sxm:{nodes}", "-o", "json"])
    return {e["claim"]: e for e in json.loads(result.stdout)["claims"]}


GANG_OF_PODS = """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: eight, namespace: ml}
spec:
  metadata: {annotations: {dralloc.dev/gang: job, dralloc.dev/gang-size: "2", dralloc.dev/gang-domain: ""}}
  spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 8}}]}}
""" + "".join(
    f"""---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: ml}}
spec:
  containers: [{{name: main, image: busybox}}]
  resourceClaims: [{{name: gpus, resourceClaimTemplateName: eight}}]
"""
    for name in ("g0", "g1")
)


def test_a_gang_of_pods_that_does_not_fit_names_the_pods_its_members_would_have_evicted(tmp_path):
    # 2 GPUs held on h100-sxm-0 and -1 (Pods p0, p1), 4 on -2 (Pod p2): no node whole for the gang's two
    # 8-GPU Pods; p0's and p1's claims fit in -2's 4 free, so theirs go and the gang takes -0 and -1
    inputs = claim("y0", 2, "h100-sxm-0", "p0") + claim("y1", 2, "h100-sxm-1", "p1") + claim("y2", 4, "h100-sxm-2", "p2")
    found = explained(tmp_path, inputs + GANG_OF_PODS, nodes=3)
    for pod in ("g0", "g1"):
        (entry,) = [e for e in found.values() if e.get("pod") == f"ml/{pod}"]
        assert entry["status"] == "unsatisfiable"
        assert entry["explanation"]["notes"][-1] == (
            "with moves on (DRALLOC_ALLOCATOR_MOVES), the allocator would ask to evict Pod(s) ml/p0, ml/p1 (claim(s) ml/y0, ml/y1; "
            "each restarts elsewhere) to make room for gang ml/job on node h100-sxm-0, h100-sxm-1; a PodDisruptionBudget may refuse"
        )
    # One member alone in the inputs: the allocator waits for the other, and evicts nothing for it yet.
    alone = explained(tmp_path, inputs + GANG_OF_PODS.rsplit("---", 1)[0], nodes=3)
    (entry,) = [e for e in alone.values() if e.get("pod") == "ml/g0"]
    assert not any("evict" in note for note in entry["explanation"]["notes"])


BIG_CLAIM = """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: big, namespace: ml}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 8}}]}}
"""


def test_a_large_claim_of_its_own_names_the_pods_it_would_have_evicted_when_no_move_makes_room(tmp_path):
    # both claims in its way are Pods' (no move in place): the Pod using ml/y goes (it fits beside ml/x)
    found = explained(tmp_path, claim("x", 6, "h100-sxm-0", "px") + claim("y", 2, "h100-sxm-1", "py") + BIG_CLAIM)
    assert found["ml/big"]["status"] == "unsatisfiable"
    assert found["ml/big"]["explanation"]["notes"][-1] == (
        "with moves on (DRALLOC_ALLOCATOR_MOVES), once its moves are due, the allocator would ask to evict Pod(s) ml/py "
        "(claim(s) ml/y; each restarts elsewhere) to make room on node h100-sxm-1; a PodDisruptionBudget may refuse"
    )
    # ml/y reserved for no Pod: a move in place makes room (moving.py), no eviction is named
    notes = explained(tmp_path, claim("x", 6, "h100-sxm-0", "px") + claim("y", 2, "h100-sxm-1", None) + BIG_CLAIM)["ml/big"]["explanation"]["notes"]
    assert "would move 1 claim(s)" in notes[-1] and not any("evict" in note for note in notes)


def test_a_pod_tied_to_a_node_by_a_shared_claim_names_the_pods_on_that_node(tmp_path):
    # ml/shared (Pod sharer) and two Pods' 2-GPU claims on h100-sxm-0 (2 free); one on -1 (6 free). ml/big uses
    # ml/shared and a 6-GPU claim: it can run only on -0 (-1's room does not help), so -0's two Pods go
    inputs = claim("shared", 2, "h100-sxm-0", "sharer") + claim("a", 2, "h100-sxm-0", "pa", 2) + claim("b", 2, "h100-sxm-0", "pb", 4)
    inputs += claim("c", 2, "h100-sxm-1", "pc") + BIG_POD.replace("count: 8", "count: 6").replace(
        "resourceClaims: [{name: gpus, resourceClaimTemplateName: eight}]",
        "resourceClaims: [{name: gpus, resourceClaimTemplateName: eight}, {name: data, resourceClaimName: shared}]",
    )
    assert notes(tmp_path, inputs)[-1] == (
        "with moves on (DRALLOC_ALLOCATOR_MOVES), the allocator would ask to evict Pod(s) ml/pa, ml/pb (claim(s) ml/a, ml/b; "
        "each restarts elsewhere) to make room on node h100-sxm-0; a PodDisruptionBudget may refuse"
    )
