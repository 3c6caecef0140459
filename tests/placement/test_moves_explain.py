"""`dralloc explain` (offline) of a large claim that does not fit says what moves would do for it
(services/allocator/moving.py `describe`): which claims, from where to where, to empty which node."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dralloc.cli import app

CLASSES = str(Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml")


def claim(name: str, count: int, node: str | None = None, first: int = 0) -> str:
    """A claim for `count` GPUs; with `node`, already allocated there (gpu-<first>...)."""
    status = ""
    if node is not None:
        results = ", ".join(f"{{request: gpu, driver: gpu.nvidia.com, pool: {node}, device: gpu-{first + i}}}" for i in range(count))
        status = f"""status:
  allocation:
    devices: {{results: [{results}]}}
    nodeSelector: {{nodeSelectorTerms: [{{matchFields: [{{key: metadata.name, operator: In, values: [{node}]}}]}}]}}
"""
    return f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}}}]}}}}
{status}"""


def explain(tmp_path: Path, text: str) -> dict[str, dict]:
    path = tmp_path / "claims.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["explain", "-f", CLASSES, "-f", str(path), "--profile", "h100-sxm:2", "-o", "json"])
    return {entry["claim"]: entry for entry in json.loads(result.stdout)["claims"]}


def test_a_large_claim_that_does_not_fit_names_the_moves_that_make_room(tmp_path):
    # h100-sxm-0: ml/x holds 4 GPUs; h100-sxm-1: ml/y holds 2; 10 GPUs free, no node whole
    doc = explain(tmp_path, claim("x", 4, "h100-sxm-0") + claim("y", 2, "h100-sxm-1") + claim("big", 8))
    big = doc["ml/big"]
    assert big["status"] == "unsatisfiable"
    assert big["explanation"]["notes"][-1] == (
        "with moves on (DRALLOC_ALLOCATOR_MOVES), near the end of its wait the allocator would move 1 claim(s) "
        "(2 devices; each restarts) to make room on node(s) h100-sxm-1: ml/y (node h100-sxm-1 -> h100-sxm-0)"
    )


def test_no_note_when_no_move_makes_room(tmp_path):
    # ml/x holds 6 GPUs of h100-sxm-0, ml/y 6 of h100-sxm-1: moving either needs 6 free elsewhere
    doc = explain(tmp_path, claim("x", 6, "h100-sxm-0") + claim("y", 6, "h100-sxm-1") + claim("big", 8))
    assert not any("moves" in note for note in doc["ml/big"]["explanation"]["notes"])
