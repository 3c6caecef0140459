"""`dralloc allocate` / `dralloc explain` / `dralloc bench engine` as CLI-CONTRACT.md specifies them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dralloc.cli import app

INPUTS = """
apiVersion: v1
kind: Node
metadata: {name: node-1}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-1-gpus}
spec:
  driver: gpu.example.com
  pool: {name: node-1, generation: 1, resourceSliceCount: 1}
  nodeName: node-1
  devices:
  - {name: gpu-0, attributes: {numa: {int: 0}}}
  - {name: gpu-1, attributes: {numa: {int: 1}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: first}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu}}]}}
"""

SECOND = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: pair, namespace: team}
spec:
  devices:
    requests: [{name: gpus, exactly: {deviceClassName: gpu, count: 2}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
"""


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "a.yaml").write_text(INPUTS)
    (tmp_path / "b.yaml").write_text(SECOND)
    return tmp_path


def test_allocate_json_and_exit_code(inputs: Path):
    result = _invoke("allocate", "-f", str(inputs), "-o", "json")
    assert result.exit_code == 1  # the pair cannot fit once `first` holds a GPU
    document = json.loads(result.stdout)
    first, pair = document["results"]
    assert first == {
        "claim": "default/first",
        "status": "allocated",
        "node": "node-1",
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]},
        },
        "message": "",
    }
    assert pair["claim"] == "team/pair" and pair["status"] == "unsatisfiable" and pair["node"] is None and pair["allocation"] is None
    assert pair["message"]
    assert "skipped v1 ConfigMap 'ignored'" in result.stderr


def test_allocate_all_allocated_is_exit_0_and_yaml(inputs: Path):
    result = _invoke("allocate", "-f", str(inputs / "a.yaml"), "--node", "node-1", "-o", "yaml")
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["results"][0]["status"] == "allocated"


def test_allocate_together(inputs: Path):
    result = _invoke("allocate", "-f", str(inputs), "--together", "-o", "json")
    assert result.exit_code == 1
    assert [r["status"] for r in json.loads(result.stdout)["results"]] == ["unsatisfiable", "unsatisfiable"]


def test_bad_input_is_exit_2_with_nothing_on_stdout(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: x}\nspec: {devices: {requests: [{name: r, exactly: {deviceClassName: gpu, count: two}}]}}\n"
    )
    result = _invoke("allocate", "-f", str(bad), "-o", "json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "bad.yaml (document 1)" in result.stderr and "count" in result.stderr
    missing = _invoke("allocate", "-f", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    assert _invoke("allocate", "-f", str(bad), "-o", "xml").exit_code == 2


def test_explain_unsatisfiable_counts_filters(inputs: Path):
    result = _invoke("explain", "-f", str(inputs), "--claim", "team/pair", "-o", "json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert "CEL runtime errors" in document["rules"]["celRuntimeErrors"]
    (claim,) = document["claims"]
    request = claim["explanation"]["nodes"][0]["requests"][0]
    counts = {f["filter"]: f["left"] for f in request["filters"]}
    assert counts["node"] == 2 and counts["in use"] == 1
    assert request["emptied_by"] == "in use"


def test_explain_table_for_people(inputs: Path):
    result = _invoke("explain", "-f", str(inputs), "-o", "table")
    assert result.exit_code == 1
    assert "devices left after" in result.stdout and "emptied by" in result.stdout
    assert "gpu.example.com/node-1/gpu-0" in result.stdout


def test_explain_unknown_claim(inputs: Path):
    result = _invoke("explain", "-f", str(inputs), "--claim", "nope")
    assert result.exit_code == 2 and "no pending claim default/nope" in result.stderr


def test_bench_engine_rejects_unknown_workloads():
    result = _invoke("bench", "engine", "--workload", "nope")
    assert result.exit_code == 2 and "unknown workload" in result.stderr


def test_bench_workloads_build_what_they_promise():
    from dralloc.cli import _benchmarks_module

    module = _benchmarks_module("engine_workloads")
    fleet = module.gpu_fleet_10k(nodes=20)
    assert fleet.devices == 160
    asked = sum(c.spec.devices.requests[0].exactly.count for c in fleet.claims)
    assert 0.9 * 160 <= asked < 0.9 * 160 + 8
    assert all(c.spec.devices.constraints for c in fleet.claims if c.spec.devices.requests[0].exactly.count > 1)
    perf = module.kube_perf_500()
    assert perf.devices == 5000 and len(perf.claims) == 5000


def test_benchmarks_run_from_the_working_directory_only_when_it_is_a_dralloc_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # an installed package (no benchmarks/ beside it) run in someone's directory must not run that
    # directory's benchmarks/*.py; run from a checkout (the native build's case) it does
    import typer

    from dralloc import cli

    monkeypatch.setattr(cli, "__file__", str(tmp_path / "site-packages" / "dralloc" / "cli.py"))
    ran = tmp_path / "ran"
    for where in ("stranger", "checkout"):
        (tmp_path / where / "benchmarks").mkdir(parents=True)
        (tmp_path / where / "benchmarks" / "probe.py").write_text(f"open({str(ran / where)!r}, 'w').close()\n")
    (tmp_path / "checkout" / "setup.py").write_text("")
    (tmp_path / "checkout" / "services" / "allocator" / "engine").mkdir(parents=True)
    ran.mkdir()

    monkeypatch.chdir(tmp_path / "stranger")
    with pytest.raises(typer.Exit):
        cli._benchmarks_module("probe")
    assert not (ran / "stranger").exists()

    monkeypatch.chdir(tmp_path / "checkout")
    cli._benchmarks_module("probe")
    assert (ran / "checkout").exists()


def test_nodes_known_only_from_slices_are_tried_in_name_order(tmp_path: Path):
    docs = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        },
        # pool "a" lives on node-b, pool "b" on node-a: slice order and node-name order disagree
        *[
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{pool}-slice"},
                "spec": {
                    "driver": "gpu.example.com",
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "nodeName": node,
                    "devices": [{"name": "gpu-0"}],
                },
            }
            for pool, node in (("a", "node-b"), ("b", "node-a"))
        ],
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        },
    ]
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = _invoke("allocate", "-f", str(path), "-o", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["results"][0]["node"] == "node-a"
