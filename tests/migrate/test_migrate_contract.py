"""MIGRATE-CONTRACT.md through the command line: inputs, output forms, --in-place, exit codes, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from migrate_helpers import EXAMPLES
from typer.testing import CliRunner

from dralloc.cli import app

HERE = Path(__file__).parent / "manifests"

NO_GPU = """# a plain web app: nothing to migrate
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  template:
    spec:
      containers:
        -   name: nginx      # odd indentation, kept
            image: 'nginx:1.27'
            resources: {limits: {nvidia.com/gpu: 0, cpu: "1"}}
---
apiVersion: v1
kind: Service
metadata:
  name: web
"""

GPU_POD = """apiVersion: v1
kind: Pod
metadata:
  name: cuda
spec:
  containers:
  - name: main
    image: nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04
    resources:
      limits:
        nvidia.com/gpu: 1
"""


def cli(*args: str, stdin: str | None = None):
    return CliRunner().invoke(app, ["migrate", *args], input=stdin)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_file_without_gpu_requests_comes_out_byte_for_byte(tmp_path):
    result = cli("-f", str(write(tmp_path, "web.yaml", NO_GPU)))
    assert result.exit_code == 0
    assert result.stdout == NO_GPU
    assert cli("-f", "-", stdin=NO_GPU).stdout == NO_GPU


def test_exit_0_when_everything_was_migrated():
    result = cli("-f", str(EXAMPLES))
    assert result.exit_code == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert kinds.count("ResourceClaimTemplate") == 5


def test_a_directory_is_read_sorted_and_the_output_is_stable(tmp_path):
    write(tmp_path, "b.yaml", GPU_POD.replace("cuda", "second"))
    write(tmp_path, "a.yml", GPU_POD)
    write(tmp_path, "notes.txt", "not a manifest")
    first = cli("-f", str(tmp_path))
    assert first.exit_code == 0
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(first.stdout)]
    assert names == ["cuda-gpu", "cuda", "second-gpu", "second"]
    assert cli("-f", str(tmp_path)).stdout == first.stdout


@pytest.mark.parametrize(
    "text, reason",
    [
        (GPU_POD.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 1\n        nvidia.com/gpumem: 8000"), "nvidia.com/gpumem"),
        (GPU_POD.replace("  containers:", "  resourceClaims:\n  - {name: nic, resourceClaimName: rdma}\n  containers:"), "already mixes"),
        (
            """apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llama}
spec:
  predictor:
    model:
      modelFormat: {name: huggingface}
      resources:
        limits: {nvidia.com/gpu: 1}
""",
            "outside a PodSpec",
        ),
        (
            """apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: train-}
spec:
  templates:
  - name: train
    container:
      image: train:1
      resources:
        limits: {nvidia.com/gpu: 2}
""",
            "outside a PodSpec",
        ),
    ],
    ids=["unknown-nvidia-resource", "mixes-claims", "kserve-model", "argo-container"],
)
def test_exit_1_leaves_what_cannot_be_migrated_and_migrates_the_rest(text, reason):
    result = cli("-f", "-", stdin=text + "---\n" + GPU_POD.replace("cuda", "other"))
    assert result.exit_code == 1
    assert reason in result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert docs[0] == yaml.safe_load(text)  # left as it was
    assert [d["kind"] for d in docs[1:]] == ["ResourceClaimTemplate", "Pod"]  # the rest migrated


def test_other_vendors_gpus_are_left_with_a_warning():
    amd = GPU_POD.replace("nvidia.com/gpu", "amd.com/gpu")
    result = cli("-f", "-", stdin=amd)
    assert result.exit_code == 0
    assert result.stdout == amd
    assert "amd.com/gpu is not an NVIDIA GPU" in result.stderr and "Pod/cuda" in result.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: [unclosed", "(document 1): invalid YAML at line 1"),
        (GPU_POD + "---\n- just\n- a list\n", "(document 2): expected a Kubernetes object"),
        (GPU_POD.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: two"), "field spec.containers[0].resources.limits.nvidia.com/gpu"),
        (GPU_POD.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: -1"), "whole number of devices"),
        (
            GPU_POD.replace("    resources:\n      limits:\n        nvidia.com/gpu: 1", "    resources:\n      limits: 3\n      requests: {nvidia.com/gpu: 1}"),
            "field spec.containers[0].resources.limits: expected a mapping",
        ),
        ("metadata: {name: a}\nmetadata: {name: b}\n", "invalid YAML"),
    ],
    ids=["yaml", "not-an-object", "words", "negative", "limits-shape", "duplicate-key"],
)
def test_exit_2_names_the_file_and_document_and_prints_nothing(tmp_path, text, message):
    path = write(tmp_path, "bad.yaml", text)
    result = cli("-f", str(EXAMPLES / "mig-inference-pod.yaml"), "-f", str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert str(path) in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_exit_2_for_missing_files_bad_flags_and_bad_usage(tmp_path):
    assert cli("-f", str(tmp_path / "nope.yaml")).exit_code == 2
    assert cli("-f", "-", "-o", "xml", stdin=GPU_POD).exit_code == 2
    assert cli("-f", "-", "--in-place", stdin=GPU_POD).exit_code == 2
    bad = write(tmp_path, "usage.csv", "namespace,pod,container,peak_memory_mib,peak_utilization\ndefault,cuda,main,lots,5\n")
    result = cli("-f", "-", "--usage", str(bad), stdin=GPU_POD)
    assert result.exit_code == 2 and result.stdout == "" and "line 2" in result.stderr and "lots" in result.stderr


def test_exit_2_for_input_with_no_end_from_a_file_or_stdin():
    """/dev/zero (stat says 0 bytes; it never ends) and stdin past the limit: refused at 16 MiB,
    not read until memory runs out."""
    result = cli("-f", "/dev/zero")
    assert result.exit_code == 2 and result.stdout == ""
    assert "/dev/zero: cannot read: larger than 16 MiB" in result.stderr and "Traceback" not in result.stderr
    result = cli("-f", "-", stdin=GPU_POD + "#" * (16 * 1024 * 1024))
    assert result.exit_code == 2 and "<stdin>: cannot read: larger than 16 MiB" in result.stderr
    assert cli("-f", "-", stdin=GPU_POD).exit_code == 0


def test_a_file_with_windows_line_ends_migrates_as_with_unix_ones(tmp_path):
    unix, windows = tmp_path / "unix.yaml", tmp_path / "windows.yaml"
    unix.write_bytes(GPU_POD.encode())
    windows.write_bytes(GPU_POD.replace("\n", "\r\n").encode())
    for output in ("yaml", "diff"):  # (the diff compares the file's text with the rewrite: line by line)
        expected = cli("-f", str(unix), "-o", output)
        assert expected.exit_code == 0 and "ResourceClaimTemplate" in expected.stdout
        assert cli("-f", str(windows), "-o", output).stdout == expected.stdout.replace(str(unix), str(windows))


def test_diff_shows_a_unified_diff_per_changed_file(tmp_path):
    gpu = write(tmp_path, "gpu.yaml", GPU_POD)
    plain = write(tmp_path, "web.yaml", NO_GPU)
    result = cli("-f", str(gpu), "-f", str(plain), "-o", "diff")
    assert result.exit_code == 0
    assert result.stdout.startswith(f"--- a/{gpu}\n+++ b/{gpu}\n")
    assert str(plain) not in result.stdout
    assert "-        nvidia.com/gpu: 1\n" in result.stdout and "+kind: ResourceClaimTemplate\n" in result.stdout


def test_json_prints_the_documents_as_json():
    result = cli("-f", "-", "-o", "json", stdin=GPU_POD)
    value = json.loads(result.stdout)
    assert value["kind"] == "List" and [i["kind"] for i in value["items"]] == ["ResourceClaimTemplate", "Pod"]
    assert value["items"][1]["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "cuda-gpu"}]


def test_in_place_rewrites_changed_files_only_and_prints_nothing(tmp_path):
    gpu = write(tmp_path, "gpu.yaml", GPU_POD)
    plain = write(tmp_path, "web.yaml", NO_GPU)
    as_json = write(tmp_path, "pod.json", json.dumps(yaml.safe_load(GPU_POD)))
    before = plain.stat().st_mtime_ns
    result = cli("-f", str(tmp_path), "--in-place")
    assert result.exit_code == 0 and result.stdout == ""
    assert [d["kind"] for d in yaml.safe_load_all(gpu.read_text())] == ["ResourceClaimTemplate", "Pod"]
    assert plain.read_text() == NO_GPU and plain.stat().st_mtime_ns == before
    rewritten = json.loads(as_json.read_text())  # JSON stays JSON: one List holding the template and the Pod
    assert [i["kind"] for i in rewritten["items"]] == ["ResourceClaimTemplate", "Pod"]
    again = cli("-f", str(tmp_path), "--in-place")
    assert again.exit_code == 0 and gpu.read_text() == cli("-f", str(gpu)).stdout


def test_template_names_do_not_collide():
    job = """apiVersion: batch/v1
kind: Job
metadata: {name: cuda}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: main, image: cuda, resources: {limits: {nvidia.com/gpu: 1}}}
"""
    existing = """apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: cuda-gpu}
spec: {spec: {devices: {requests: [{name: x, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
"""
    result = cli("-f", "-", stdin=existing + "---\n" + GPU_POD + "---\n" + job)
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(result.stdout) if d["kind"] == "ResourceClaimTemplate"]
    assert names == ["cuda-gpu", "cuda-2-gpu", "cuda-3-gpu"]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(7)),
            "aliases expanded",
        ),
        ("a: " + "[" * 300 + "]" * 300 + "\n", "nested deeper"),
    ],
    ids=["alias-bomb", "deep"],
)
def test_hostile_documents_are_refused_quickly(text, message):
    result = cli("-f", "-", stdin=text)
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""
