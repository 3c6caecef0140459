"""`dralloc migrate` on realistic manifests of every kind: the output is valid Kubernetes (1.34 schemas and
dralloc's own resource.k8s.io checks), asks for the same GPUs per container, allocates them on a simulated
fleet, keeps comments, and does not change on a second run."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import msgspec
import pytest
from migrate_helpers import EXAMPLES, allocate, documents, gpus_before, migrate, objects, pod_objects, template_counts

from dralloc.schemas.resource import ResourceClaimTemplate
from dralloc.schemas.validation import validate

HERE = Path(__file__).parent / "manifests"
CASES = sorted(HERE.glob("*.yaml")) + sorted(EXAMPLES.glob("*.yaml"))
CORE = {"Pod", "Deployment", "StatefulSet", "Job", "CronJob", "ConfigMap", "Service"}


@pytest.fixture(params=CASES, ids=lambda p: p.name)
def case(request) -> tuple[str, list[dict], list[dict]]:
    text = request.param.read_text()
    result = migrate(text)
    assert result.exit_code == 0, result.report.problems
    return text, documents(text), documents(result.stdout)


def test_no_gpu_extended_resource_is_left(case):
    _, _, out = case
    for obj in objects(out):
        text = str(obj)
        assert "nvidia.com/gpu" not in text and "nvidia.com/mig-" not in text, obj


def test_output_validates_against_the_kubernetes_schemas(case):
    _, _, out = case
    for doc in objects(out):  # a List has no schema: its items do
        if doc["kind"] in CORE or doc["kind"] == "ResourceClaimTemplate":
            kubernetes_validate.validate(doc, "1.34", strict=True)
        else:  # a custom resource: the pods Kubernetes would make from its templates
            for pod in pod_objects(doc):
                kubernetes_validate.validate(pod, "1.34", strict=True)
    for obj in objects(out):
        if obj["kind"] == "ResourceClaimTemplate":
            assert validate(msgspec.convert(obj, ResourceClaimTemplate)) == []


def test_each_container_asks_for_as_many_devices_as_before(case):
    _, before, out = case
    counts = template_counts(out)
    old = gpus_before(before)
    assert old, "every case asks for GPUs"
    # keys name (object, pod spec path, container); an init container reusing an app request may see more
    assert set(counts) == set(old)
    for key, n in old.items():
        assert counts[key] >= n if key[2] in ("gpu-check",) else counts[key] == n, key


def test_allocates_the_same_gpus_per_container_on_a_fleet(case):
    _, before, out = case
    allocated = allocate(out)
    for key, n in gpus_before(before).items():
        devices, _, names = allocated[key]
        assert devices >= n if key[2] == "gpu-check" else devices == n, (key, names)


def test_migrating_the_output_again_changes_nothing(case):
    _, _, out = case
    text = migrate(case[0]).stdout
    again = migrate(text)
    assert again.exit_code == 0
    assert again.stdout == text


def test_two_gpu_containers_never_share_a_request():
    text = (HERE / "multi-container.yaml").read_text()
    out = documents(migrate(text).stdout)
    allocated = allocate(out)
    llm = allocated[("rag", "('spec', 'template', 'spec')", "llm")][2]
    reranker = allocated[("rag", "('spec', 'template', 'spec')", "reranker")][2]
    assert len(llm) == 2 and len(reranker) == 1 and not set(llm) & set(reranker)
    proxy = next(c for c in out[-1]["spec"]["template"]["spec"]["containers"] if c["name"] == "proxy")
    assert "resources" not in proxy


def test_init_containers_reuse_an_app_request_and_sidecars_get_their_own():
    out = documents(migrate((HERE / "init-sidecar.yaml").read_text()).stdout)
    template, pod = out
    requests = {r["name"]: r["exactly"]["count"] for r in template["spec"]["spec"]["devices"]["requests"]}
    assert requests == {"trainer": 2, "dcgm-sidecar": 1, "big-init": 4}
    refs = {c["name"]: c["resources"]["claims"] for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
    assert refs["gpu-check"] == [{"name": "gpu", "request": "trainer"}]
    assert refs["dcgm-sidecar"] == [{"name": "gpu", "request": "dcgm-sidecar"}]
    assert refs["big-init"] == [{"name": "gpu", "request": "big-init"}]


def test_comments_quotes_and_unchanged_documents_are_kept():
    text = (HERE / "comments.yaml").read_text()
    out = migrate(text).stdout
    # the header and the ConfigMap come out as they went in, byte for byte
    assert out.startswith(text[: text.index("# the model server")])
    for kept in (
        "# the model server",
        "# keep the name short",
        'owner: "team-a"   # quoted on purpose',
        "# the only GPU container",
        "value: /cache   # shared cache",
        'image: "vllm/vllm-openai:v0.6.3"',
    ):
        assert kept in out, kept
    # the document keeps its indentation style (sequences indented under their key)
    assert "      containers:\n        - name: server" in out


def test_templates_come_right_before_their_workload_in_its_namespace():
    out = documents(migrate((EXAMPLES / "pytorchjob.yaml").read_text()).stdout)
    assert [d["kind"] for d in out] == ["ResourceClaimTemplate", "ResourceClaimTemplate", "PyTorchJob"]
    assert [d["metadata"]["name"] for d in out[:2]] == ["llama-finetune-master-gpu", "llama-finetune-worker-gpu"]
    assert {d["metadata"]["namespace"] for d in out} == {"training"}
    no_namespace = documents(migrate((HERE / "job.yaml").read_text()).stdout)
    assert "namespace" not in no_namespace[0]["metadata"]


def test_a_list_gets_its_templates_inside_right_before_the_item():
    out = documents(migrate((HERE / "list.yaml").read_text()).stdout)
    assert len(out) == 1 and out[0]["kind"] == "List"
    assert [i["kind"] for i in out[0]["items"]] == ["ConfigMap", "ResourceClaimTemplate", "Deployment"]
    assert out[0]["items"][1]["metadata"] == {"name": "mistral-gpu", "namespace": "infer"}


def test_nested_custom_resource_templates_are_named_by_their_role():
    out = documents(migrate((HERE / "jobset.yaml").read_text()).stdout)
    assert [d["metadata"]["name"] for d in out if d["kind"] == "ResourceClaimTemplate"] == ["maxtext-workers-gpu"]
    ray = documents(migrate((EXAMPLES / "raycluster.yaml").read_text()).stdout)
    assert ray[0]["metadata"]["name"] == "ray-batch-inference-l40s-workers-gpu"
    head = ray[1]["spec"]["headGroupSpec"]["template"]["spec"]
    assert "resourceClaims" not in head  # the CPU-only head is left alone


def test_time_slicing_keeps_the_gpu_shareable():
    template = documents(migrate((HERE / "timeslicing.yaml").read_text()).stdout)[0]
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert devices["config"][0]["opaque"]["parameters"]["sharing"] == {"strategy": "TimeSlicing"}
    # GFD's -SHARED suffix names the same product: the claim still lands on that A100
    allocated = allocate([template, documents(migrate((HERE / "timeslicing.yaml").read_text()).stdout)[1]])
    ((_, node, _),) = allocated.values()
    assert node.startswith("a100-pcie")


def test_mig_resources_become_mig_requests_on_that_profile():
    out = documents(migrate((EXAMPLES / "mig-inference-pod.yaml").read_text()).stdout)
    request = out[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == "mig.nvidia.com" and request["count"] == 1
    allocated = allocate(out)
    ((n, node, devices),) = allocated.values()
    assert n == 1 and "-mig-1g10gb-" in devices[0]
