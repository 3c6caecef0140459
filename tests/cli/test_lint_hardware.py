"""`dralloc lint` knows the hardware: every suggestion kind is allocated on a fleet; names no driver
publishes, NVLink, engine limits, fleet shape, workloads and empty input are reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dralloc.allocator.offline import run
from dralloc.cli import app
from dralloc.lint import SUGGESTED, lint
from dralloc.manifests import load_text
from dralloc.simulated import simulated_objects

FLEET = simulated_objects(["h100-sxm", "h200-sxm-mig", "l40s-pcie"])


def class_doc(expression: str, name: str = "bad") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: {name}}}
spec:
  selectors:
  - cel:
      expression: {json.dumps(expression)}
"""


def suggestion_for(expression: str) -> tuple[str, list[str]]:
    (problem,) = lint(load_text(class_doc(expression), "class.yaml"))
    suggested = [h.removeprefix(SUGGESTED) for h in problem.hints if h.startswith(SUGGESTED)]
    assert suggested, problem
    return suggested[0], list(problem.hints)


def allocated_with(expression: str, tmp_path: Path) -> dict:
    """Allocate one device of a class that uses `expression` on the fleet; the outcome as JSON."""
    path = tmp_path / "use.yaml"
    path.write_text(
        class_doc(expression, "fixed")
        + """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: one}
spec: {devices: {requests: [{name: d, exactly: {deviceClassName: fixed}}]}}
"""
    )
    result = run([path], extra=FLEET)
    (outcome,) = result.outcomes
    return outcome.contract()


# one case per kind of correction lint makes; each suggestion must allocate on the fleet
SUGGESTION_KINDS = {
    "driver as a resource name": ("device.driver == 'nvidia.com/gpu'", "device.driver == 'gpu.nvidia.com'"),
    "attributes not keyed by domain": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['productName'].startsWith('NVIDIA H100')",
        "device.attributes['gpu.nvidia.com'].productName",
    ),
    "quantity field and comparison": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['memory'].quantity >= quantity('40Gi')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    ),
    "typed value field": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type.string == 'gpu'",
        "device.attributes['gpu.nvidia.com'].type == 'gpu'",
    ),
    "missing device prefix": ("driver == 'gpu.nvidia.com'", "device.driver == 'gpu.nvidia.com'"),
    "name published under another domain": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].nvlink == true",
        "device.attributes['dralloc.dev'].nvlink == true",
    ),
    "close spelling": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productname.startsWith('NVIDIA')",
        "device.attributes['gpu.nvidia.com'].productName",
    ),
    "domain typo": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.co'].type == 'mig'",
        "device.attributes['gpu.nvidia.com'].type == 'mig'",
    ),
    "the article's selector": (
        "device.driver == 'nvidia.com/gpu' && device.attributes['memory'].quantity >= quantity('40Gi') && device.attributes['nvlink'].boolean == true",
        "device.attributes['dralloc.dev'].nvlink == true",
    ),
}


@pytest.mark.parametrize("kind", list(SUGGESTION_KINDS))
def test_every_suggestion_kind_allocates_on_a_fleet(kind, tmp_path):
    bad, expected_part = SUGGESTION_KINDS[kind]
    suggested, hints = suggestion_for(bad)
    assert expected_part in suggested
    assert any("selects" in h and "representative fleet" in h for h in hints)
    outcome = allocated_with(suggested, tmp_path)
    assert outcome["status"] == "allocated", outcome
    # the original fails, so the suggestion is what made the difference
    assert allocated_with(bad, tmp_path)["status"] != "allocated"


def test_a_valid_selector_on_a_name_no_driver_publishes_is_a_problem():
    expression = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].nvlink == true"
    (problem,) = lint(load_text(class_doc(expression), "class.yaml"))
    assert "no driver publishes" in problem.message
    text = "\n".join(problem.hints)
    assert "publishes it as dralloc.dev/nvlink" in text
    assert "matchAttribute: dralloc.dev/nvlinkDomain" in text and "constraint" in text


def test_no_suggestion_when_the_correction_selects_nothing():
    # productName is real; no profile is an "H900"; the close-spelling fix compiles but selects nothing
    expression = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productname == 'NVIDIA H900'"
    (problem,) = lint(load_text(class_doc(expression), "class.yaml"))
    assert not any(h.startswith(SUGGESTED) for h in problem.hints)
    assert "no corrected expression: the correction selects no device on a representative fleet" in problem.hints


def test_a_class_selector_that_fails_on_other_drivers_devices_is_a_problem():
    (problem,) = lint(load_text(class_doc("device.attributes['gpu.nvidia.com'].type == 'gpu'"), "class.yaml"))
    assert problem.message.startswith("fails at run time on devices of other drivers")
    assert any("no such key: type (device dra.net/" in h for h in problem.hints)
    assert not lint(load_text(class_doc("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"), "ok.yaml"))


CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: c}}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}
"""


def test_engine_limit_and_fleet_shape():
    classes = (Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml").read_text()
    (limit,) = lint(load_text(CLAIM.format(count=100) + "---\n" + classes, "c.yaml"))
    assert limit.field == "spec.devices.requests[0].exactly.count"
    assert "asks for 100 devices; a claim holds at most 32" in limit.message
    (shape,) = lint(load_text(CLAIM.format(count=9) + "---\n" + classes, "c.yaml"))
    assert "no node of a representative fleet has more than 8" in shape.message
    assert any("gang" in h for h in shape.hints)
    assert lint(load_text(CLAIM.format(count=8) + "---\n" + classes, "c.yaml")) == []


def test_workloads_are_linted_with_their_template_fields(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml}
spec:
  replicas: 4
  template:
    spec:
      containers: [{name: c}]
      resourceClaims: [{name: gpu, resourceClaimTemplateName: missing}]
""")
    result = CliRunner().invoke(app, ["lint", "-f", str(path), "-o", "json"])
    assert result.exit_code == 1
    (problem,) = json.loads(result.stdout)["problems"]
    assert problem["where"].endswith("Deployment/web")
    assert problem["field"] == "spec.template.spec.resourceClaims[0].resourceClaimTemplateName"
    assert "skipped" not in result.stderr


def test_empty_input_is_a_warning(tmp_path):
    result = CliRunner().invoke(app, ["lint", "-f", str(tmp_path)])
    assert result.exit_code == 0
    assert "no Kubernetes object found (nothing was checked)" in result.stderr
    as_json = CliRunner().invoke(app, ["lint", "-f", str(tmp_path), "-o", "json"])
    assert json.loads(as_json.stdout)["warnings"] == [f"{tmp_path}: no Kubernetes object found (nothing was checked)"]


def test_long_expressions_are_cut_in_suggestions():
    padding = " || ".join(["device.attributes['gpu.nvidia.com'].productName == 'x'"] * 80)
    expression = f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].nvlink == true && ({padding} || true)"
    (problem,) = lint(load_text(class_doc(expression), "class.yaml"))
    assert all(len(h) < 1000 for h in problem.hints)
    assert any("characters)" in h for h in problem.hints if h.startswith(SUGGESTED))


def test_the_static_name_tables_cover_what_the_fleet_publishes():
    """The ingestor checks names without a fleet (hardware.ATTRIBUTES); they must not fall behind discovery."""
    from dralloc import hardware

    fleet = hardware.catalog()
    for domain, names in fleet.attributes.items():
        assert names.items() <= hardware.ATTRIBUTES[domain].items(), domain
    for domain, names in fleet.capacities.items():
        assert names <= hardware.CAPACITIES[domain], domain
