"""`dralloc plan`: device plugin vs DRA on one simulated fleet, from the same engine."""

from __future__ import annotations

import json
import sys

import pytest
from migrate_helpers import EXAMPLES
from typer.testing import CliRunner

from dralloc.cli import app
from dralloc.migrate.documents import InputError
from dralloc.migrate.plan import plan

SMALL = [{"profile": "h100-sxm-mig", "count": 1, "prefix": "h100"}, {"profile": "l40s-pcie", "count": 1, "prefix": "l40s"}]
USAGE = "namespace,pod,container,peak_memory_mib,peak_utilization\ninference,vllm-llama3-abc,vllm,7600,9\n"


@pytest.fixture
def usage(tmp_path):
    path = tmp_path / "usage.csv"
    path.write_text(USAGE)
    return str(path)


def test_mig_and_right_sizing_need_fewer_gpus_than_the_device_plugin(usage):
    paths = [str(EXAMPLES / "vllm-deployment.yaml"), str(EXAMPLES / "mig-inference-pod.yaml")]
    result, _ = plan(paths, SMALL, usage)
    assert result["workloads"] == 2 and result["pods"] == 3
    # device plugin: two whole H100s for vLLM, one whole GPU for the MIG pod; DRA: three MIG slices on one H100
    assert result["device_plugin_gpus"] == 3 and result["dra_gpus"] == 1
    assert result["gpus_saved"] == 2
    assert result["device_plugin_nodes"] == 1 and result["dra_nodes"] == 1
    assert result["not_fitted_device_plugin"] == result["not_fitted_dra"] == 0
    assert [d["workload"] for d in result["drivers"]] == ["Deployment/inference/vllm-llama3", "Pod/inference/triton-mig"]
    assert result["drivers"][0]["why"] == "MIG slices" and result["drivers"][0]["dra_gpus"] == pytest.approx(2 / 7, abs=0.01)


def test_without_usage_data_whole_gpus_stay_whole():
    result, _ = plan([str(EXAMPLES / "vllm-deployment.yaml")], SMALL)
    assert result["device_plugin_gpus"] == result["dra_gpus"] == 2 and result["gpus_saved"] == 0


def test_replicas_of_every_kind_are_counted():
    result, _ = plan([str(EXAMPLES)], [{"profile": "h100-sxm-mig", "count": 4}, {"profile": "l40s-pcie", "count": 1}])
    pods = {d["workload"]: d["pods"] for d in result["drivers"]}
    assert pods == {
        "Deployment/inference/vllm-llama3": 2,
        "PyTorchJob/training/llama-finetune": 3,
        "RayCluster/inference/ray-batch-inference": 4,
        "Pod/inference/triton-mig": 1,
    }
    assert result["device_plugin_gpus"] == 2 + 24 + 4 + 1


def test_too_many_workloads_say_how_many_did_not_fit_in_each_mode():
    result, _ = plan([str(EXAMPLES / "pytorchjob.yaml")], [{"profile": "h100-sxm", "count": 2}])
    assert result["pods"] == 3
    assert result["not_fitted_device_plugin"] == 1 and result["not_fitted_dra"] == 1
    assert result["device_plugin_gpus"] == result["dra_gpus"] == 16


def test_cli_json_table_exit_codes_and_chart(tmp_path, usage):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(json.dumps(SMALL))
    runner = CliRunner()
    ok = runner.invoke(app, ["plan", "-f", str(EXAMPLES / "vllm-deployment.yaml"), "--fleet", str(fleet), "--usage", usage, "--json"])
    assert ok.exit_code == 0, ok.stderr
    value = json.loads(ok.stdout)
    for key in ("workloads", "device_plugin_gpus", "dra_gpus", "gpus_saved", "not_fitted_device_plugin", "not_fitted_dra"):
        assert key in value
    table = runner.invoke(app, ["plan", "-f", str(EXAMPLES / "vllm-deployment.yaml"), "--fleet", str(fleet), "--usage", usage])
    assert "GPUs needed" in table.stdout and "MIG slices" in table.stdout
    too_big = runner.invoke(app, ["plan", "-f", str(EXAMPLES / "pytorchjob.yaml"), "--fleet", str(fleet), "--json"])
    assert too_big.exit_code == 1
    bad = runner.invoke(app, ["plan", "-f", str(EXAMPLES), "--fleet", str(tmp_path / "missing.yaml")])
    assert bad.exit_code == 2 and "missing.yaml" in bad.stderr and bad.stdout == ""
    svg = tmp_path / "plan.svg"
    drawn = runner.invoke(
        app, ["plan", "-f", str(EXAMPLES / "vllm-deployment.yaml"), "--fleet", str(fleet), "--usage", usage, "-o", "svg", "--chart-file", str(svg)]
    )
    assert drawn.exit_code == 0 and svg.read_text().lstrip().startswith("<?xml") and "GPUs saved" in svg.read_text()


def test_the_chart_without_matplotlib_says_how_to_get_it(tmp_path, usage, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were not installed
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(json.dumps(SMALL))
    result = CliRunner().invoke(app, ["plan", "-f", str(EXAMPLES / "vllm-deployment.yaml"), "--fleet", str(fleet), "-o", "png"])
    assert result.exit_code == 1 and "pip install 'dralloc[plot]'" in result.stderr


def test_hostile_replicas_are_refused(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text((EXAMPLES / "vllm-deployment.yaml").read_text().replace("replicas: 2", "replicas: 100000000"))
    with pytest.raises(InputError, match="replicas: 100000000"):
        plan([str(path)], SMALL)
