"""`dralloc explain` (offline) allocates a gang as the allocator does, all-or-nothing inside one
domain, and a gang that does not fit says what the allocator would hold for it while it waits."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dralloc.cli import app

CLASSES = str(Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml")


def claim(name: str, count: int, gang: str | None = None, size: int = 2) -> str:
    marks = f'annotations: {{dralloc.dev/gang: {gang}, dralloc.dev/gang-size: "{size}", dralloc.dev/gang-domain: ""}}, ' if gang else ""
    return f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml, {marks}}}
spec: {{devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}}}]}}}}
"""


def explain(tmp_path: Path, text: str, *args: str) -> dict:
    path = tmp_path / "claims.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["explain", "-f", CLASSES, "-f", str(path), *args, "-o", "json"])
    return json.loads(result.stdout)


def test_a_gang_that_does_not_fit_says_what_it_would_hold_while_it_waits(tmp_path):
    # two nodes: h100-sxm-0 holds a 1-GPU claim, so a gang of two 8-GPU claims does not fit
    text = claim("busy", 1) + claim("w-0", 8, "train") + claim("w-1", 8, "train")
    doc = explain(tmp_path, text, "--profile", "h100-sxm:2")
    by_name = {entry["claim"]: entry for entry in doc["claims"]}
    assert by_name["ml/busy"]["status"] == "allocated"
    for member in ("ml/w-0", "ml/w-1"):
        entry = by_name[member]
        assert entry["status"] == "unsatisfiable"
        assert entry["message"].startswith("gang ml/train: cannot place all 2 pending claims inside one cluster")
        assert entry["explanation"]["notes"] == [
            "if gang ml/train may wait (dralloc.dev/max-wait), the allocator holds for it what is closest to fitting "
            "(other claims take it last; gang ml/train waits for the claims there to leave): "
            "node h100-sxm-0 (1 of 8 devices in use, by ml/busy); node h100-sxm-1 (0 of 8 devices in use)"
        ]


def test_a_gang_is_all_or_nothing_offline_too(tmp_path):
    # three 8-GPU members, two nodes: none is allocated (one at a time, two would have been)
    text = "".join(claim(f"w-{i}", 8, "big", 3) for i in range(3))
    doc = explain(tmp_path, text, "--profile", "h100-sxm:2")
    assert {entry["status"] for entry in doc["claims"]} == {"unsatisfiable"}
    assert doc["claims"][0]["explanation"]["notes"] == [
        "gang ml/big: no domain could hold all its claims even with every device free; nothing is held for it while it waits"
    ]
    # two of them fit: allocated together inside the cluster
    doc = explain(tmp_path, "".join(claim(f"w-{i}", 8, "two") for i in range(2)), "--profile", "h100-sxm:2")
    assert [entry["status"] for entry in doc["claims"]] == ["allocated", "allocated"]
    assert {entry["node"] for entry in doc["claims"]} == {"h100-sxm-0", "h100-sxm-1"}


def test_a_gang_with_members_missing_from_the_inputs_says_so(tmp_path):
    doc = explain(tmp_path, claim("w-0", 8, "train", 4) + claim("w-1", 8, "train", 4) + claim("w-2", 8, "train", 4), "--profile", "h100-sxm:2")
    notes = doc["claims"][0]["explanation"]["notes"]
    assert notes[0] == "gang ml/train: 3 of its 4 claims are in the inputs; the allocator waits for all 4"
