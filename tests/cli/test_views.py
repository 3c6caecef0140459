"""`dralloc get` and `dralloc top` against a running system (real nats-server, the four services),
rendered at 80 and 200 columns (rich console capture) and as users run them (piped, --watch)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_terminal import ctrl_c_once_shown
from rich.console import Console

from dralloc.bus import Bus
from dralloc.client.busview import snapshot
from dralloc.client.fleetview import FleetState
from dralloc.client.get import claims_view, devices_view, nodes_view, render
from dralloc.client.top import render as render_top
from dralloc.demo import running
from dralloc.statuswriter.sinks import DEFAULT_BUCKET, read_all

DRALLOC = str(Path(sys.executable).parent / "dralloc")
CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"
LONG = "a-claim-with-a-very-long-name-that-a-narrow-terminal-cannot-show-whole"

CLAIMS = (
    CLASSES.read_text()
    + f"""
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: slice, namespace: ml}}
spec: {{devices: {{requests: [{{name: mig, exactly: {{deviceClassName: mig.nvidia.com}}}}]}}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {LONG}, namespace: ml}}
spec: {{devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: gpu.nvidia.com, count: 4,
  selectors: [{{cel: {{expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L40S'"}}}}]}}}}]}}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: too-big, namespace: research}}
spec: {{devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: gpu.nvidia.com, count: 9}}}}]}}}}
"""
)


def dralloc(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([DRALLOC, *args], env={**os.environ, "NATS_URL": url}, capture_output=True, text=True, timeout=120)


@pytest.fixture
async def system(nats_url, tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIMS)
    async with running(nats_url, paths=[str(path)], fleet=[("h100-sxm-mig", 1), ("l40s-pcie", 2)]), await Bus.connect(nats_url, name="test") as bus:
        kv = await bus.key_value(DEFAULT_BUCKET)
        async with asyncio.timeout(60):
            while len(await read_all(kv)) < 3:
                await asyncio.sleep(0.2)
        yield bus


def captured(width: int, terminal: bool = True) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None)


def text_of(console: Console) -> str:
    return console.file.getvalue()  # type: ignore[attr-defined]


async def state_of(bus: Bus) -> FleetState:
    return (await snapshot(bus))[0]


async def test_nodes_and_devices_show_use_partitions_and_fragmentation(system):
    state = await state_of(system)
    view = nodes_view(state, wide=False, now=time.time())
    rows = {row[0]: row for row in view.rows}
    # NODE PROFILE GPUS USED PARTITIONED FREE FRAGMENTATION NVLINK-DOMAINS AGE
    assert rows["h100-sxm-mig-0"][2:7] == ("8", "0", "1", "7", "88%")
    l40s = sorted(rows[n][2:7] for n in ("l40s-pcie-0", "l40s-pcie-1"))
    assert l40s == [("8", "0", "0", "8", "0%"), ("8", "4", "0", "4", "50%")]
    assert rows["h100-sxm-mig-0"][7] == "h100-sxm-mig-0/nvswitch"
    devices = devices_view(state, wide=True, now=time.time())
    parted = [row for row in devices.rows if row[4] == "partitioned"]
    assert len(parted) == 1 and parted[0][5] == "ml/slice" and parted[0][2] == "gpu"
    holder = [row for row in devices.rows if row[2] == "mig" and row[4] == "used"]
    assert len(holder) == 1 and holder[0][9] == parted[0][1]  # the partition's PARENT is the partitioned GPU


@pytest.mark.parametrize("width", [80, 200])
async def test_get_tables_fit_the_terminal_and_name_what_fits(system, width):
    state = await state_of(system)
    for view in (nodes_view(state, wide=False, now=time.time()), devices_view(state, wide=False, now=time.time())):
        console = captured(width)
        render(view, "x", "table", console)
        assert all(len(line) <= width for line in text_of(console).splitlines())
    statuses = [s for s, _ in state.decisions.values()]
    console = captured(width)
    render(claims_view(statuses, wide=False, cut=True, now=time.time()), "claims", "table", console)
    out = text_of(console)
    assert all(len(line) <= width for line in out.splitlines())
    assert ("ml/" + LONG in out) == (width == 200)  # cut to fit at 80 columns, whole at 200


@pytest.mark.parametrize("width", [80, 200])
async def test_top_at_80_and_200_columns(system, width):
    state = await state_of(system)
    console = captured(width)
    console.print(render_top(state, time.time(), width))
    out = text_of(console)
    assert all(len(line) <= width for line in out.splitlines()), out
    assert "3 nodes  24 GPUs: 4 used, 1 partitioned, 19 free" in out
    assert "claims: 2 allocated, 1 not" in out
    assert "research/too-big" in out and "unsatisfiable" in out
    assert "h100-sxm-mig-0" in out and "88%" in out  # the most fragmented node
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["gpu.nvidia.com"][1:4] == ["24", "5", "19"]  # 4 used and 1 partitioned of 24 whole GPUs


async def test_get_commands_piped_keep_full_names_and_speak_json_yaml_name(system, nats_url):
    piped = await asyncio.to_thread(dralloc, "get", "claims", url=nats_url)
    assert piped.returncode == 0 and f"ml/{LONG}" in piped.stdout
    assert piped.stdout.splitlines()[0].split() == ["CLAIM", "STATUS", "NODE", "DEVICES", "MESSAGE", "AGE"]
    only = await asyncio.to_thread(dralloc, "get", "claims", "-n", "research", "-o", "json", url=nats_url)
    assert [c["claim"] for c in json.loads(only.stdout)["claims"]] == ["research/too-big"]
    one = await asyncio.to_thread(dralloc, "get", "claims", "slice", "-o", "name", url=nats_url)
    assert one.stdout == "resourceclaim.resource.k8s.io/slice\n"
    missing = await asyncio.to_thread(dralloc, "get", "nodes", "nope", url=nats_url)
    assert missing.returncode == 1 and "dralloc: get nodes: 'nope' not found" in missing.stderr
    nodes = yaml.safe_load((await asyncio.to_thread(dralloc, "get", "nodes", "-o", "yaml", url=nats_url)).stdout)["nodes"]
    assert {n["name"] for n in nodes} == {"h100-sxm-mig-0", "l40s-pcie-0", "l40s-pcie-1"}
    classes = await asyncio.to_thread(dralloc, "get", "classes", url=nats_url)
    assert "gpu.nvidia.com" in classes.stdout and "mig.nvidia.com" in classes.stdout
    slices = await asyncio.to_thread(dralloc, "get", "slices", "-o", "name", url=nats_url)
    assert "resourceslice.resource.k8s.io/l40s-pcie-1-gpu-0" in slices.stdout.splitlines()
    bad = await asyncio.to_thread(dralloc, "get", "claims", "-n", "x", "-A", url=nats_url)
    assert bad.returncode == 2


async def test_get_watch_prints_a_row_when_a_claim_is_decided(system, nats_url, tmp_path):
    proc = subprocess.Popen(
        [DRALLOC, "get", "claims", "-w"], env={**os.environ, "NATS_URL": nats_url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        header = await asyncio.to_thread(proc.stdout.readline)
        assert header.split()[0] == "CLAIM"
        for _ in range(3):
            await asyncio.to_thread(proc.stdout.readline)  # the three claims decided so far
        path = tmp_path / "new.yaml"
        path.write_text(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: late, namespace: ml}\n"
            "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n"
        )
        submitted = await asyncio.to_thread(dralloc, "submit", "-f", str(path), url=nats_url)
        assert submitted.returncode == 0, submitted.stderr
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line.split()[:2] == ["ml/late", "allocated"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(proc.wait, 30)  # in a thread: the services under test share this loop
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"`get claims -w` still running 30 s after SIGINT; its stderr: {proc.communicate()[1][-2000:]!r}")
    assert "Traceback" not in proc.stderr.read()


async def test_top_once_piped_and_live_on_a_terminal(system, nats_url):
    once = await asyncio.to_thread(dralloc, "top", url=nats_url)  # piped: one screen, then exit
    assert once.returncode == 0, once.stderr
    assert "3 nodes  24 GPUs" in once.stdout and "research/too-big" in once.stdout

    env = {**os.environ, "NATS_URL": nats_url, "COLUMNS": "80", "LINES": "40"}
    code, stderr = await asyncio.to_thread(ctrl_c_once_shown, [DRALLOC, "top"], b"pending claims", env=env, timeout=60)
    assert code == 0
    assert stderr == b""
