"""`dralloc lint`: the article's manifest is diagnosed; the project's examples are clean."""

import json
import subprocess
import sys
from pathlib import Path

from dralloc.lint import lint
from dralloc.manifests import load_paths, load_text

REPO = Path(__file__).resolve().parents[1]


def run_lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dralloc.cli", "lint", *args], capture_output=True, text=True, timeout=60)


def test_article_manifest_is_diagnosed_with_a_corrected_expression(shared_dir):
    result = run_lint("-f", str(shared_dir / "examples" / "seed-manifest.yaml"), "-o", "json")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    problems = json.loads(result.stdout)["problems"]
    by_field = {p["field"]: p for p in problems}
    cel = by_field["spec.selectors[0].cel.expression"]
    assert "DeviceClass/high-bandwidth-gpu" in cel["where"]
    assert cel["message"].startswith("invalid CEL")
    hints = "\n".join(cel["hints"])
    assert "gpu.nvidia.com" in hints and "keyed by domain" in hints and "compareTo(quantity('40Gi'))" in hints
    suggested = next(h for h in cel["hints"] if h.startswith("suggested expression: "))
    # The suggestion itself must be valid CEL in the device environment.
    from dralloc.allocator.engine.cel import compile_selector

    compile_selector(suggested.removeprefix("suggested expression: "))
    template = by_field["spec.resourceClaims[0].resourceClaimTemplateName"]
    assert "h100-nvlink-template" in template["message"]


def test_text_output_names_file_object_and_field(shared_dir):
    result = run_lint("-f", str(shared_dir / "examples" / "seed-manifest.yaml"))
    assert result.returncode == 1
    assert "seed-manifest.yaml (document 1): DeviceClass/high-bandwidth-gpu: spec.selectors[0].cel.expression" in result.stdout
    assert "2 object(s) checked, 2 problem(s)" in result.stdout


def test_project_examples_are_clean():
    result = run_lint("-f", str(REPO / "examples"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 problem(s)" in result.stdout


def test_problems_of_every_layer_are_reported_and_reading_goes_on():
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: typo}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: many}}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: syntax}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: missing-class
        selectors: [{cel: {expression: "device.driver == "}}]
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: ok}
spec: {selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com'"}}]}
"""
    problems = [str(p) for p in lint(load_text(text, "mixed.yaml"))]
    assert any("ResourceClaim/typo: field spec.devices.requests[0].exactly.count" in p for p in problems)
    assert any("ResourceClaim/syntax: spec.devices.requests[0].exactly.selectors[0].cel.expression: invalid CEL" in p for p in problems)
    assert any("DeviceClass 'missing-class' is not defined" in p for p in problems)
    assert not any("DeviceClass/ok" in p for p in problems)


def test_unknown_file_is_a_problem_not_a_traceback(tmp_path):
    result = run_lint("-f", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "cannot read file" in result.stdout
    assert "Traceback" not in result.stderr


def test_corpus_lints_clean_except_its_missing_classes(shared_dir):
    """Upstream accepts every corpus object; lint may only report the DeviceClasses upstream could not find."""
    import yaml

    for path in sorted((shared_dir / "corpus" / "upstream-verdicts").glob("*.yaml")):
        header = next(yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader))
        problems = [p for p in lint(load_paths([path])) if "DifferentialCase" not in p.where]
        missing_upstream = {
            r["message"].split("device class ")[1].split(":")[0] for r in header["upstream"]["results"] if "could not retrieve device class" in r["message"]
        }
        missing_here = {p.message.split("'")[1] for p in problems if p.message.startswith("DeviceClass ")}
        # the engine's limit (32 devices per claim) is reported where upstream refused the claim for it too
        over_limit = any("exceeds the claim limit" in r["message"] for r in header["upstream"]["results"])
        limit = [p for p in problems if "a claim holds at most 32" in p.message]
        assert bool(limit) == over_limit, path
        assert [p for p in problems if not p.message.startswith("DeviceClass ") and p not in limit] == [], path
        assert missing_here >= missing_upstream, path
