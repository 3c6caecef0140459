"""infra/ admission policies that contain a leaked Kubernetes credential: the CEL is evaluated with
cel-python (an independent implementation) on the requests an attacker would send."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest

INFRA = Path(__file__).resolve().parents[2] / "infra"
sys.path.insert(0, str(INFRA.parent / "tests" / "infra"))

from kustomize_render import find, render  # noqa: E402

DISCOVERY = "system:serviceaccount:dralloc:dralloc-discovery"


def admit(policy: dict[str, Any], request: dict[str, Any], obj: dict | None, old: dict | None) -> tuple[bool, str]:
    """(allowed, message) as the API server evaluates a ValidatingAdmissionPolicy with action Deny."""
    env = celpy.Environment()
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    run = lambda expression, act: env.program(env.compile(expression)).evaluate(act)  # noqa: E731
    if not all(bool(run(c["expression"], activation)) for c in policy["spec"].get("matchConditions", [])):
        return True, "not matched"
    variables = {v["name"]: run(v["expression"], activation) for v in policy["spec"].get("variables", [])}
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    for validation in policy["spec"]["validations"]:
        if not bool(run(validation["expression"], activation)):
            message = validation.get("message") or str(run(validation["messageExpression"], activation))
            return False, message
    return True, ""


def slice_on(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "gpu.nvidia.com", "pool": {"name": node or "fabric", "generation": 1, "resourceSliceCount": 1}}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu-0"}, "spec": spec}


def request(operation: str, user: str = DISCOVERY, node: str | None = "node-a") -> dict[str, Any]:
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    return {"operation": operation, "userInfo": {"username": user, "extra": extra}}


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    objects = render(INFRA / "publish-slices")
    for obj in objects:
        kubernetes_validate.validate(obj, "1.34", strict=True)
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "dralloc-discovery-own-node-slices")
    assert binding["spec"]["validationActions"] == ["Deny"]
    return find(objects, "ValidatingAdmissionPolicy", binding["spec"]["policyName"])


def test_a_nodes_discovery_writes_its_own_nodes_slices(policy):
    assert admit(policy, request("CREATE"), slice_on("node-a"), None)[0]
    assert admit(policy, request("UPDATE"), slice_on("node-a"), slice_on("node-a"))[0]
    assert admit(policy, request("DELETE"), None, slice_on("node-a"))[0]


def test_a_nodes_discovery_may_not_touch_another_nodes_or_cluster_slices(policy):
    allowed, message = admit(policy, request("CREATE"), slice_on("node-b"), None)
    assert not allowed and "may not change slices of node 'node-b'" in message
    assert not admit(policy, request("DELETE"), None, slice_on("node-b"))[0]
    assert not admit(policy, request("UPDATE"), slice_on("node-b"), slice_on("node-a"))[0]
    assert not admit(policy, request("CREATE"), slice_on(None), None)[0]


def test_a_token_without_a_node_may_write_no_slice(policy):
    allowed, message = admit(policy, request("CREATE", node=None), slice_on("node-a"), None)
    assert not allowed and "no node in this service account token" in message


def test_other_users_are_not_this_policys_business(policy):
    assert admit(policy, request("CREATE", user="system:serviceaccount:nvidia:driver", node=None), slice_on("node-b"), None) == (True, "not matched")


INGESTOR = "system:serviceaccount:dralloc:dralloc-ingestor"


@pytest.fixture(scope="module")
def pod_policy() -> dict[str, Any]:
    objects = render(INFRA)
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "dralloc-ingestor-pod-writes")
    assert binding["spec"]["validationActions"] == ["Deny"]
    return find(objects, "ValidatingAdmissionPolicy", binding["spec"]["policyName"])


def gated_pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "train"}},
        "spec": {
            "containers": [{"name": "main", "image": "trainer:1"}],
            "schedulingGates": [{"name": "dralloc.dev/allocate"}, {"name": "other.io/gate"}],
        },
        "status": {"phase": "Pending", **status},
    }


def pod_request(subresource: str = "") -> dict[str, Any]:
    return {"operation": "UPDATE", "subResource": subresource, "userInfo": {"username": INGESTOR, "extra": {}}}


def test_the_ingestor_may_lift_its_gate_and_record_claims(pod_policy):
    old = gated_pod()
    lifted = gated_pod()
    lifted["spec"]["schedulingGates"] = [{"name": "other.io/gate"}]
    assert admit(pod_policy, pod_request(), lifted, old)[0]
    recorded = gated_pod(resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "p-gpu"}])
    assert admit(pod_policy, pod_request("status"), recorded, old)[0]


def test_the_ingestor_may_not_change_a_pods_image_labels_other_gates_or_status(pod_policy):
    old = gated_pod()
    image = gated_pod()
    image["spec"]["containers"][0]["image"] = "evil:1"
    assert not admit(pod_policy, pod_request(), image, old)[0]
    labels = gated_pod()
    labels["metadata"]["labels"] = {"app": "train", "owned": "yes"}
    assert not admit(pod_policy, pod_request(), labels, old)[0]
    other_gate = gated_pod()
    other_gate["spec"]["schedulingGates"] = [{"name": "dralloc.dev/allocate"}]
    assert not admit(pod_policy, pod_request(), other_gate, old)[0]
    allowed, message = admit(pod_policy, pod_request("status"), gated_pod(phase="Failed"), old)
    assert not allowed and "only record claims" in message
