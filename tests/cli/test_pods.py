"""dralloc.pods: workloads to Pods, claim entries, extended resources, pod specs anywhere."""

import msgspec
import pytest
import yaml

from dralloc.pods import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    MAX_PODS_PER_WORKLOAD,
    POD_CLAIM_NAME_ANNOTATION,
    PodError,
    class_for_extended_resources,
    extended_resource_claim,
    find_pod_specs,
    pod_claims,
    request_mappings,
    workload_pods,
)
from dralloc.schemas.resource import DeviceClass, Pod, ResourceClaimTemplate


def doc(text: str):
    return yaml.safe_load(text)


TEMPLATE = msgspec.convert(
    doc("""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus, namespace: ml}
spec:
  metadata: {labels: {team: ml}}
  spec:
    devices:
      requests:
      - {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}
"""),
    ResourceClaimTemplate,
)

POD_TEMPLATE = """
    metadata: {labels: {app: train}}
    spec:
      containers:
      - name: trainer
        resources: {claims: [{name: gpus}]}
      resourceClaims:
      - {name: gpus, resourceClaimTemplateName: two-gpus}
"""


@pytest.mark.parametrize(
    ("api", "kind", "spec", "names"),
    [
        ("apps/v1", "Deployment", "replicas: 3\n  template:" + POD_TEMPLATE, ["train-0", "train-1", "train-2"]),
        ("apps/v1", "StatefulSet", "replicas: 2\n  template:" + POD_TEMPLATE, ["train-0", "train-1"]),
        ("apps/v1", "ReplicaSet", "template:" + POD_TEMPLATE, ["train-0"]),
        ("apps/v1", "DaemonSet", "template:" + POD_TEMPLATE, ["train-0"]),
        ("batch/v1", "Job", "parallelism: 4\n  completions: 2\n  template:" + POD_TEMPLATE, ["train-0", "train-1"]),
        ("batch/v1", "Job", "parallelism: 2\n  template:" + POD_TEMPLATE, ["train-0", "train-1"]),
        ("apps/v1", "Deployment", "replicas: 0\n  template:" + POD_TEMPLATE, []),
    ],
)
def test_workloads_stand_for_their_replicas(api, kind, spec, names):
    text = f"apiVersion: {api}\nkind: {kind}\nmetadata: {{name: train, namespace: ml}}\nspec:\n  {spec}"
    pods = workload_pods(doc(text))
    assert [p.metadata.name for p in pods] == names
    for pod in pods:
        assert pod.metadata.namespace == "ml"
        assert pod.metadata.labels == {"app": "train"}
        assert pod.metadata.owner_references[0].kind == kind
        assert pod.spec.containers[0].name == "trainer"
        assert pod.spec.resource_claims[0].resource_claim_template_name == "two-gpus"


def test_cronjob_reads_its_job_template():
    text = """
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 0 * * *"
  jobTemplate:
    spec:
      parallelism: 2
      template:""" + POD_TEMPLATE.replace("\n    ", "\n        ")
    pods = workload_pods(doc(text))
    assert [(p.metadata.namespace, p.metadata.name) for p in pods] == [("default", "nightly-0"), ("default", "nightly-1")]


def test_a_pod_is_itself():
    (pod,) = workload_pods(doc("apiVersion: v1\nkind: Pod\nmetadata: {name: solo}\nspec: {containers: [{name: c}]}"))
    assert pod.metadata.name == "solo" and pod.spec.containers[0].name == "c"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: many, template: {}}",
            "field spec.replicas: expected an integer, got str",
        ),
        ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: -1, template: {}}", "field spec.replicas: must be 0 or more, got -1"),
        (
            f"apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: x}}\nspec: {{replicas: {MAX_PODS_PER_WORKLOAD + 1}, template: {{}}}}",
            "more than dralloc expands",
        ),
        ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: 1}", "field spec.template: a pod template (a mapping) is required"),
        ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {}\nspec: {template: {}}", "field metadata.name: required"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: 3}]}}}",
            "field spec.template.spec.containers[0].name: Expected `str`, got `int`",
        ),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: x}", "not a Pod or a workload kind"),
    ],
)
def test_bad_workloads_name_the_field(text, message):
    with pytest.raises(PodError, match=None) as caught:
        workload_pods(doc(text))
    assert message in str(caught.value)


def pod(text: str) -> Pod:
    return msgspec.convert(doc(text), Pod)


def test_template_entries_make_claims_named_pod_entry_offline():
    p = pod("""
apiVersion: v1
kind: Pod
metadata: {name: train-0, namespace: ml}
spec:
  containers: [{name: c}]
  resourceClaims:
  - {name: gpus, resourceClaimTemplateName: two-gpus}
  - {name: shared, resourceClaimName: scratch}
  - {name: missing, resourceClaimTemplateName: nope}
  - {name: both, resourceClaimName: a, resourceClaimTemplateName: two-gpus}
  - {name: gpus, resourceClaimTemplateName: two-gpus}
""")
    result = pod_claims(p, {("ml", "two-gpus"): TEMPLATE})
    (made,) = result.made
    assert made.key == "ml/train-0-gpus"
    assert made.metadata.annotations[POD_CLAIM_NAME_ANNOTATION] == "gpus"
    assert made.metadata.labels == {"team": "ml"}
    assert made.metadata.owner_references[0].name == "train-0"
    assert made.spec.devices.requests[0].exactly.count == 2
    assert result.existing == ["ml/scratch"]
    assert [str(e) for e in result.errors] == [
        "field spec.resourceClaims[2].resourceClaimTemplateName: ResourceClaimTemplate ml/nope not found",
        "field spec.resourceClaims[3]: exactly one of resourceClaimName and resourceClaimTemplateName is required",
        "field spec.resourceClaims[4].name: duplicate entry 'gpus'",
    ]
    # as the API server would name it: generateName plus a stable 5-character suffix
    (online,) = pod_claims(p, {("ml", "two-gpus"): TEMPLATE}, offline=False).made
    assert online.metadata.generate_name == "train-0-gpus-"
    assert online.metadata.name.startswith("train-0-gpus-") and len(online.metadata.name) == len("train-0-gpus-") + 5


CLASSES = [
    msgspec.convert(d, DeviceClass)
    for d in yaml.safe_load_all("""
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {extendedResourceName: nvidia.com/gpu}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: old-gpu, creationTimestamp: "2025-01-01T00:00:00Z"}
spec: {extendedResourceName: nvidia.com/gpu}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic.dralloc.dev}
""")
]


def test_extended_resource_names_map_to_the_newest_class_and_implicitly():
    mapping = class_for_extended_resources(CLASSES)
    assert mapping["nvidia.com/gpu"] == "gpu.nvidia.com"
    assert mapping["deviceclass.resource.kubernetes.io/old-gpu"] == "old-gpu"
    assert mapping["deviceclass.resource.kubernetes.io/nic.dralloc.dev"] == "nic.dralloc.dev"
    assert class_for_extended_resources(list(reversed(CLASSES))) == mapping


def test_extended_resources_become_one_claim_with_the_schedulers_request_names():
    p = pod("""
apiVersion: v1
kind: Pod
metadata: {name: infer, namespace: ml}
spec:
  initContainers:
  - name: warmup            # non-sidecar init: reuses the later containers' requests
    resources: {limits: {nvidia.com/gpu: 3}}
  - name: proxy             # sidecar: long-lived
    restartPolicy: Always
    resources: {requests: {cpu: "1", nvidia.com/gpu: 1}}
  containers:
  - name: server
    resources: {limits: {nvidia.com/gpu: "2", memory: 1Gi, deviceclass.resource.kubernetes.io/nic.dralloc.dev: 1}}
  - name: logger
    resources: {requests: {cpu: 100m}}
""")
    claim = extended_resource_claim(p, CLASSES, name="infer-extended-resources")
    assert claim.key == "ml/infer-extended-resources"
    assert claim.metadata.annotations == {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    assert claim.metadata.generate_name == "infer-extended-resources-"
    got = [(r.name, r.exactly.device_class_name, r.exactly.count) for r in claim.spec.devices.requests]
    # server is container index 2 (after two init containers); its sorted resources are
    # deviceclass...nic (0), memory (1), nvidia.com/gpu (2). The proxy's sorted resources: cpu (0), nvidia.com/gpu (1).
    # warmup wants 3: the proxy's 1 and the server's 2 cover it, so it adds no request.
    assert got == [
        ("container-1-request-1", "gpu.nvidia.com", 1),
        ("container-2-request-0", "nic.dralloc.dev", 1),
        ("container-2-request-2", "gpu.nvidia.com", 2),
    ]
    assert [(m.container, m.resource, m.request) for m in request_mappings(p, claim)] == [
        ("proxy", "nvidia.com/gpu", "container-1-request-1"),
        ("server", "deviceclass.resource.kubernetes.io/nic.dralloc.dev", "container-2-request-0"),
        ("server", "nvidia.com/gpu", "container-2-request-2"),
    ]


def test_init_containers_ask_only_for_what_later_containers_do_not_cover_and_the_largest_is_kept():
    p = pod("""
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  initContainers:
  - {name: a, resources: {requests: {nvidia.com/gpu: 4}}}
  - {name: b, resources: {requests: {nvidia.com/gpu: 6}}}
  containers:
  - {name: main, resources: {requests: {nvidia.com/gpu: 1}}}
""")
    claim = extended_resource_claim(p, CLASSES)
    assert [(r.name, r.exactly.count) for r in claim.spec.devices.requests] == [("container-1-request-0", 5), ("container-2-request-0", 1)]
    assert claim.metadata.name.startswith("p-extended-resources-")


def test_no_claim_without_a_mapped_extended_resource_and_bad_quantities_are_errors():
    plain = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {requests: {cpu: 2, example.com/fpga: 1}}}]}")
    assert extended_resource_claim(plain, CLASSES) is None
    half = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 500m}}}]}")
    with pytest.raises(PodError, match=r"field spec.containers\[0\].resources.limits\[nvidia.com/gpu\]: an extended resource must be a whole number"):
        extended_resource_claim(half, CLASSES)
    result = pod_claims(half, {}, classes=CLASSES)
    assert not result.made and "whole number" in str(result.errors[0])
    whole = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 8}}}]}")
    (made,) = pod_claims(whole, {}, classes=CLASSES).made
    assert made.key == "default/p-extended-resources" and made.spec.devices.requests[0].exactly.count == 8


def test_pod_specs_are_found_anywhere_with_their_paths():
    custom = doc("""
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: llm}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch}]
    Worker:
      template:
        spec:
          containers: [{name: pytorch}]
          initContainers: [{name: init, containers: [{name: not-a-pod-spec-inside-one}]}]
  lists:
  - {containers: [{name: x}]}
  - {containers: [{noname: x}]}
  - {containers: []}
""")
    assert [path for path, _ in find_pod_specs(custom)] == [
        "spec.pytorchReplicaSpecs.Master.template.spec",
        "spec.pytorchReplicaSpecs.Worker.template.spec",
        "spec.lists[0]",
    ]


def test_find_pod_specs_does_not_follow_hostile_nesting():
    deep: dict = {"containers": [{"name": "deep"}]}
    for _ in range(200):
        deep = {"x": deep}
    assert list(find_pod_specs(deep)) == []
    assert [p for p, _ in find_pod_specs({"a": [{"b": {"containers": [{"name": "c"}]}}]})] == ["a[0].b"]
