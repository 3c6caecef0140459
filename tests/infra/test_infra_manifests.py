"""infra/ renders, validates against the Kubernetes 1.34 schemas, and deploys what the design says."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kustomize_render import KustomizeError, containers, find, granted, render

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERNETES = "1.34"  # resource.k8s.io/v1 is GA from here on


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(INFRA)


def test_every_object_validates_against_the_kubernetes_schema(objects: list[dict[str, Any]]) -> None:
    assert len(objects) >= 10
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_publish_slices_overlay_validates_and_gives_discovery_a_token(objects: list[dict[str, Any]]) -> None:
    overlay = render(INFRA / "publish-slices")
    for obj in overlay:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    pod = find(overlay, "DaemonSet", "dralloc-discovery")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert {"name": "DRALLOC_DISCOVERY_KUBERNETES", "value": "true"} in pod["containers"][0]["env"]
    assert {res for _, res, _ in granted(overlay, "dralloc-discovery")} == {"resourceslices"}
    assert granted(overlay, "dralloc-ingestor") == granted(objects, "dralloc-ingestor")


def test_claim_templates_overlay_validates_and_adds_only_the_controller(objects: list[dict[str, Any]]) -> None:
    overlay = render(INFRA / "claim-templates")
    for obj in overlay:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert len(overlay) == len(objects) + 2  # the controller's ClusterRole and binding
    env = {e["name"]: e["value"] for e in containers(find(overlay, "Deployment", "dralloc-ingestor"))[0]["env"]}
    assert env["DRALLOC_INGESTOR_CLAIM_TEMPLATES"] == "true"
    base_env = {e["name"] for e in containers(find(objects, "Deployment", "dralloc-ingestor"))[0]["env"]}
    assert "DRALLOC_INGESTOR_CLAIM_TEMPLATES" not in base_env  # off by default
    added = granted(overlay, "dralloc-ingestor") - granted(objects, "dralloc-ingestor")
    # (Pods, their status and creating claims are the base's already: the scheduling gate needs them.)
    assert added == {("resource.k8s.io", "resourceclaimtemplates", "get")}


def test_the_validator_rejects_a_mistake(objects: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(find(objects, "Deployment", "dralloc-allocator"))
    broken["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["nmae"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    broken = copy.deepcopy(find(objects, "Deployment", "dralloc-allocator"))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_renderer_refuses_transformations_it_does_not_apply(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nreplacements: [{path: r.yaml}]\n")
    with pytest.raises(KustomizeError, match="replacements"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: [{path: p.yaml}]\n")
    with pytest.raises(KustomizeError, match="only inline JSON 6902"):
        render(tmp_path)


def test_workloads(objects: list[dict[str, Any]]) -> None:
    allocator = find(objects, "Deployment", "dralloc-allocator")
    assert allocator["spec"]["replicas"] == 2  # active + hot standby
    for name in ("dralloc-ingestor", "dralloc-statuswriter"):
        assert find(objects, "Deployment", name)["spec"]["replicas"] == 1
    discovery = find(objects, "DaemonSet", "dralloc-discovery")
    pod = discovery["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    nvml = next(v for v in pod["volumes"] if v["name"] == "nvml")
    assert nvml["hostPath"]["path"].endswith("libnvidia-ml.so.1") and mounts["nvml"]["readOnly"]
    lib_dir = mounts["nvml"]["mountPath"].rsplit("/", 1)[0]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["LD_LIBRARY_PATH"] == lib_dir  # pynvml finds the mounted library


def test_every_workload_runs_one_service_of_the_image_with_its_own_account(objects: list[dict[str, Any]]) -> None:
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    services = set()
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        (container,) = containers(workload)
        assert container["image"] == "dralloc:0.1.0"
        assert container["args"][0] == "run"
        services.add(container["args"][1])
        account = find(objects, "ServiceAccount", pod["serviceAccountName"])
        assert account["metadata"]["name"] == f"dralloc-{container['args'][1]}"
        assert account["metadata"]["namespace"] == workload["metadata"]["namespace"] == "dralloc"
        for source in container.get("envFrom", []):
            find(objects, "ConfigMap", source["configMapRef"]["name"])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert pod["securityContext"]["runAsNonRoot"] is True
    assert services == {"allocator", "ingestor", "statuswriter", "discovery"}


def test_least_privilege(objects: list[dict[str, Any]]) -> None:
    # Services that only talk to NATS get no token and no role at all.
    for name in ("dralloc-allocator", "dralloc-discovery"):
        assert find(objects, "ServiceAccount", name)["automountServiceAccountToken"] is False
        assert granted(objects, name) == set()
    # The ingestor reads; its only writes are the scheduling gate's: lift the gate (patch pods), make the
    # extended-resource claim and record it in the Pod's status. It never deletes or replaces anything.
    writes = {(g, r, v) for g, r, v in granted(objects, "dralloc-ingestor") if v not in ("get", "list", "watch")}
    assert writes == {("", "pods", "patch"), ("", "pods/status", "patch"), ("resource.k8s.io", "resourceclaims", "create")}
    # The status writer: claim status, the claim's finalizer, Events (and reads Pods for their uid), evictions.
    assert granted(objects, "dralloc-statuswriter") == {
        ("resource.k8s.io", "resourceclaims/status", "get"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
        ("resource.k8s.io", "resourceclaims", "patch"),
        ("", "pods", "get"),
        ("", "events", "create"),
        ("", "events", "get"),
        ("", "events", "patch"),
        ("", "pods/eviction", "create"),  # moves in a cluster: the Eviction API (PodDisruptionBudgets honoured)
    }
    assert not any(
        o["kind"] in ("Role", "ClusterRole") and any("*" in r.get("verbs", []) + r.get("resources", []) for r in o.get("rules", [])) for o in objects
    )


def test_nats_values_ask_for_a_jetstream_cluster_on_files() -> None:
    kustomization = yaml.safe_load((INFRA / "nats" / "kustomization.yaml").read_text())
    (chart,) = kustomization["helmCharts"]
    assert chart["name"] == "nats" and (INFRA / "nats" / chart["valuesFile"]).is_file()
    values = yaml.safe_load((INFRA / "nats" / chart["valuesFile"]).read_text())
    config = values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    assert config["jetstream"]["enabled"] is True
    assert config["jetstream"]["fileStore"]["enabled"] is True and config["jetstream"]["fileStore"]["pvc"]["enabled"] is True
    assert config["jetstream"]["memoryStore"]["enabled"] is False
    # The services' NATS_URL points at the chart's client service for release `nats` in the same namespace.
    nats_url = find(render(INFRA), "ConfigMap", "dralloc-config")["data"]["NATS_URL"]
    assert nats_url == f"nats://{chart['releaseName']}:4222" and chart["namespace"] == kustomization["namespace"] == "dralloc"


def test_otel_settings_are_the_standard_variables(objects: list[dict[str, Any]]) -> None:
    data = find(objects, "ConfigMap", "dralloc-config")["data"]
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://") and data["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4318")
    assert data["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"  # what dralloc.telemetry's exporter speaks
    for workload in (o for o in objects if o["kind"] in ("Deployment", "DaemonSet")):
        env = {e["name"]: e.get("value") for e in containers(workload)[0]["env"]}
        assert env["OTEL_SERVICE_NAME"] == workload["metadata"]["name"]


def test_commands_and_settings_are_ones_dralloc_knows(objects: list[dict[str, Any]]) -> None:
    from dralloc.cli import run_app

    commands = {c.name for c in run_app.registered_commands}
    code = "\n".join(p.read_text() for p in (REPO / "services").rglob("*.py"))
    settings = dict(find(objects, "ConfigMap", "dralloc-config")["data"])
    for workload in (o for o in objects if o["kind"] in ("Deployment", "DaemonSet")):
        container = containers(workload)[0]
        assert container["args"][1] in commands
        for variable in [e["name"] for e in container.get("env", [])] + list(settings):
            if variable.startswith("DRALLOC_") or variable == "NATS_URL":
                assert f'"{variable}"' in code, f"{workload['metadata']['name']}: {variable} is read nowhere in services/"
