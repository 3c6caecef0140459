"""Recording NVML's answers: a recording replays to exactly the same slices."""

from __future__ import annotations

import copy
import json

import msgspec
from test_discover_cli import discover

from dralloc.discovery import attributes as A
from dralloc.discovery.nvml import read_inventory
from dralloc.discovery.record import RecordingSource
from dralloc.discovery.replay import ReplaySource
from dralloc.discovery.slices import build_slices


def slices_of(source) -> bytes:
    return msgspec.json.encode(build_slices(read_inventory(source, "n")))


def test_a_recording_replays_to_the_same_slices(shared_dir) -> None:
    capture = json.loads((shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json").read_text())
    capture["devices"].append(copy.deepcopy(capture["devices"][0]))
    capture["devices"][1].update(minor=1, uuid="GPU-b", remappedRows=[0, 0, 1, 0])
    capture["devices"][1]["pciInfo"] = {"busId": "00000000:00:07.0"}
    capture["devices"][1]["nvlinks"] = [{"link": 0, "state": 1, "remoteBusId": "00000000:00:06.0"}]
    capture["pairs"] = [{"a": 0, "b": 1, "p2pNvlink": 0}]
    recorder = RecordingSource(ReplaySource(capture))
    live = slices_of(recorder)
    recording = json.loads(json.dumps(recorder.capture))
    assert slices_of(ReplaySource(recording)) == live
    assert recording["devices"][0]["nvlinks"][1]["state"] == {"error": "NVMLError_NotSupported: Not Supported"}


def test_a_lost_gpu_is_recorded_as_lost(shared_dir) -> None:
    capture = json.loads((shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json").read_text())
    capture["devices"][0]["uuid"] = {"error": "NVMLError_GpuIsLost: GPU is lost"}
    recorder = RecordingSource(ReplaySource(capture))
    inventory = read_inventory(recorder, "n")
    assert inventory.gpus[0].taints == [(A.TAINT_UNHEALTHY, "gpu-lost")]
    assert read_inventory(ReplaySource(recorder.capture), "n").gpus[0].taints == [(A.TAINT_UNHEALTHY, "gpu-lost")]


def test_discover_capture_writes_a_replayable_file(shared_dir, tmp_path) -> None:
    out = tmp_path / "capture.json"
    original = str(shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json")
    first = discover("--replay", original, "--node", "x", "--capture", str(out), "-o", "json")
    assert first.returncode == 0, first.stderr
    again = discover("--replay", str(out), "--node", "x", "-o", "json")
    assert again.returncode == 0 and again.stdout == first.stdout
    refused = discover("--profile", "h100-sxm", "--capture", str(out))
    assert refused.returncode == 2 and "--capture" in refused.stderr
