"""`dralloc discover`: the command as a user runs it (a real subprocess, real exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import yaml

from dralloc.schemas.resource import ResourceSlice


def discover(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from dralloc.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, "discover", *args], capture_output=True, text=True, timeout=60)


def test_replay_prints_slices_as_json_list(shared_dir) -> None:
    run = discover("--replay", str(shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json"), "--node", "h200", "-o", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    slices = [msgspec.convert(item, ResourceSlice) for item in doc["items"]]
    assert doc["kind"] == "List" and [s.metadata.name for s in slices] == ["h200-gpu-0", "h200-gpu-1"]


def test_profile_prints_yaml_documents() -> None:
    run = discover("--profile", "l40s-pcie", "--node", "n1", "--layout", "1.34")
    assert run.returncode == 0, run.stderr
    docs = list(yaml.safe_load_all(run.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["n1-gpu-0", "n1-nic-0"]
    assert all(d["kind"] == "ResourceSlice" and d["apiVersion"] == "resource.k8s.io/v1" for d in docs)


def test_mistakes_are_one_line_and_exit_2(tmp_path) -> None:
    for args, message in (
        (("--profile", "h900"), "unknown hardware profile 'h900'"),
        (("--profile", "h100-sxm", "--replay", "x.json"), "exclude each other"),
        (("--profile", "h100-sxm", "-o", "xml"), "--output must be one of"),
        (("--replay", str(tmp_path / "none.json")), "cannot read"),
    ):
        run = discover(*args)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
        assert run.stdout == ""


def test_no_nvml_is_a_clear_message_and_non_zero_exit() -> None:
    """Without --profile/--replay the real NVML is used; where it cannot load, say so (this
    machine has no NVIDIA driver; on a GPU machine the command succeeds instead)."""
    run = discover("-o", "json")
    if run.returncode == 0:
        assert json.loads(run.stdout)["kind"] == "List"
    else:
        assert run.returncode == 1 and "NVML" in run.stderr and "--profile" in run.stderr
        assert "Traceback" not in run.stderr
