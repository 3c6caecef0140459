"""`dralloc explain` in an operator's words: nodes grouped by verdict, holders named, a change suggested."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dralloc.cli import app

CLASSES = str(Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml")


def claim(name: str, count: int, class_name: str = "gpu.nvidia.com") -> str:
    return f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec: {{devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: {class_name}, count: {count}}}}}]}}}}
"""


def explain(tmp_path: Path, text: str, *args: str, width: int = 200):
    path = tmp_path / "claims.yaml"
    path.write_text(text)
    table = CliRunner().invoke(app, ["explain", "-f", CLASSES, "-f", str(path), *args, "-o", "table"], terminal_width=width)
    as_json = CliRunner().invoke(app, ["explain", "-f", CLASSES, "-f", str(path), *args, "-o", "json"])
    return table, json.loads(as_json.stdout)


def test_28_nodes_with_the_same_verdict_are_one_group(tmp_path):
    table, doc = explain(tmp_path, claim("nine", 9), "--profile", "h100-sxm:28")
    (entry,) = doc["claims"]
    (group,) = entry["groups"]
    assert len(group["nodes"]) == 28
    assert group["verdict"] == (
        "28 nodes: only 8 matching devices each, 9 wanted (request gpus): "
        "split the claim, or use a gang (several claims allocated together: dralloc submit --gang)"
    )
    assert table.stdout.count("devices left after") == 1  # one table for the group, not 28
    assert not any(ch in table.stdout for ch in "│┃━─┏")  # one table style everywhere: no box, bold headers
    assert "nodes: h100-sxm-0, h100-sxm-1" in table.stdout and "and 20 more" in table.stdout


def test_mig_partitions_in_use_name_their_claims(tmp_path):
    text = claim("slice", 1, "mig.nvidia.com") + claim("eight", 8)
    _, doc = explain(tmp_path, text, "--profile", "h100-sxm-mig:1", "--claim", "ml/eight")
    (entry,) = doc["claims"]
    (group,) = entry["groups"]
    assert group["holders"] == ["ml/slice"]
    assert group["verdict"].startswith(
        "1 node: 7 of 8 matching devices have their shared counters free, 8 wanted (request gpus): partitions (MIG) held by ml/slice"
    )
    assert "ask for a partition instead" in group["verdict"]


def test_devices_in_use_name_the_claims_and_groups_differ(tmp_path):
    # two nodes: one filled by two claims, one half used; a claim for 5 GPUs fits neither
    text = claim("a", 4) + claim("b", 4) + claim("c", 4) + claim("five", 5)
    table, doc = explain(tmp_path, text, "--profile", "l40s-pcie:2", "--claim", "ml/five")
    (entry,) = doc["claims"]
    assert entry["status"] == "unsatisfiable"
    verdicts = sorted(g["verdict"] for g in entry["groups"])
    assert len(verdicts) == 2
    assert verdicts[0].startswith("1 node: 0 of 8 matching devices free, 5 wanted (request gpus); the others are held by ml/a, ml/b")
    assert verdicts[1].startswith("1 node: 4 of 8 matching devices free, 5 wanted (request gpus); the others are held by ml/c")
    assert "held by ml/a, ml/b" in table.stdout


def test_grouped_explanations_fit_80_columns_titles_aside(tmp_path):
    table, _ = explain(tmp_path, claim("nine", 9), "--profile", "l40s-pcie:3", width=80)
    lines = table.stdout.splitlines()
    table_lines = [line for line in lines if line.startswith("  ") and ("│" in line or "  " in line.strip())]
    assert all(len(line) <= 80 for line in table_lines)


def test_explain_reads_workloads_and_names_the_pod(tmp_path):
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: nine, namespace: ml}
spec: {spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 9}}]}}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  template:
    spec:
      containers: [{name: c}]
      resourceClaims: [{name: gpus, resourceClaimTemplateName: nine}]
"""
    table, doc = explain(tmp_path, text, "--profile", "l40s-pcie:2")
    (entry,) = doc["claims"]
    assert entry["claim"] == "ml/train-0-gpus" and entry["pod"] == "ml/train-0"
    assert entry["groups"][0]["verdict"].startswith("2 nodes: only 8 matching devices each, 9 wanted")
    assert "ml/train-0-gpus (Pod ml/train-0): unsatisfiable" in table.stdout
