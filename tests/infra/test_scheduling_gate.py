"""infra/scheduling-gate: the MutatingAdmissionPolicy that hands DRA Pods to dralloc validates for
each Kubernetes version it is for, and its match conditions pick the right Pods (evaluated with
cel-python, an independent CEL implementation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
from kustomize_render import find, render

GATE_DIR = Path(__file__).resolve().parents[2] / "infra" / "scheduling-gate"


@pytest.mark.parametrize(
    ("directory", "versions", "api"),
    [
        (GATE_DIR, ["1.36", "1.37"], "admissionregistration.k8s.io/v1"),
        (GATE_DIR / "v1beta1", ["1.34", "1.35"], "admissionregistration.k8s.io/v1beta1"),
    ],
)
def test_the_policy_validates_for_its_kubernetes_versions(directory: Path, versions: list[str], api: str) -> None:
    objects = render(directory)
    assert {(o["kind"], o["apiVersion"]) for o in objects} == {("MutatingAdmissionPolicy", api), ("MutatingAdmissionPolicyBinding", api)}
    for version in versions:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)
    policy = find(objects, "MutatingAdmissionPolicy", "dralloc-scheduling-gate")
    assert find(objects, "MutatingAdmissionPolicyBinding", "dralloc-scheduling-gate")["spec"]["policyName"] == "dralloc-scheduling-gate"
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == {"matchLabels": {"dralloc.dev/allocate": "true"}}
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    assert '"dralloc.dev/allocate"' in policy["spec"]["mutations"][0]["applyConfiguration"]["expression"]


def matches(pod: dict[str, Any]) -> bool:
    policy = find(render(GATE_DIR), "MutatingAdmissionPolicy", "dralloc-scheduling-gate")
    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel(pod)}
    return all(bool(env.program(env.compile(c["expression"])).evaluate(activation)) for c in policy["spec"]["matchConditions"])


def test_it_gates_pods_that_use_dra_and_no_others() -> None:
    container = {"name": "main", "image": "busybox"}
    assert matches({"spec": {"containers": [container], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}})
    assert matches({"spec": {"containers": [{**container, "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}})
    assert not matches({"spec": {"containers": [container]}})
    assert not matches({"spec": {"containers": [{**container, "resources": {"requests": {"cpu": "1"}}}]}})
    assert not matches(
        {"spec": {"containers": [container], "resourceClaims": [{"name": "g", "resourceClaimName": "c"}], "nodeName": "node-0"}}
    )  # bound already (created with nodeName): nothing to gate
