"""The discovery service on a real nats-server: publish on change, rescan, health, restart, withdraw."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import msgspec
import pytest
from discovery_checks import slice_problems

from dralloc.bus import Bus
from dralloc.discovery import attributes as A
from dralloc.discovery.nvml import read_inventory
from dralloc.discovery.replay import ReplaySource
from dralloc.discovery.service import Config, serve
from dralloc.discovery.slices import build_slices
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ObjectMeta


async def current(bus: Bus) -> tuple[dict[str, ev.ResourceSlicePublished], list[ev.ResourceSliceRemoved], dict]:
    events, _ = await bus.replay("INVENTORY")
    slices = {e.slice.metadata.name: e for e in events if isinstance(e, ev.ResourceSlicePublished)}
    removed = [e for e in events if isinstance(e, ev.ResourceSliceRemoved)]
    nodes = {e.node.metadata.name: e.node for e in events if isinstance(e, ev.NodePublished)}
    return slices, removed, nodes


async def last_seq(bus: Bus) -> int:
    return (await bus.stream_state("INVENTORY")).last_sequence


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


@pytest.fixture
def capture_file(shared_dir, tmp_path) -> Path:
    """The real H200 capture, with a second GPU (another minor, UUID and bus id) added."""
    data = json.loads((shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json").read_text())
    second = copy.deepcopy(data["devices"][0])
    second.update(index=1, minor=1, uuid="GPU-second")
    second["pciInfo"] = {**second["pciInfo"], "busId": "00000000:00:07.0"}
    data["devices"].append(second)
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(data))
    return path


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


async def test_profile_node_is_published_once_and_withdrawn_on_stop(bus: Bus) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, Config(source="profile", profile="h200-sxm-mig", node="n1"), stop))

    async def published():
        return len((await current(bus))[0]) == 6

    await until(published)
    slices, removed, nodes = await current(bus)
    assert slice_problems([e.slice for e in slices.values()], "1.35") == []
    assert {e.slice.spec.pool.generation for e in slices.values()} == {1} and not removed
    assert nodes["n1"].metadata.labels[A.LABEL_PROFILE] == "h200-sxm-mig"
    stop.set()
    await asyncio.wait_for(task, 10)
    slices, removed, _ = await current(bus)
    assert slices == {} and len(removed) == 6
    events, _ = await bus.replay("INVENTORY")
    assert any(isinstance(e, ev.NodeRemoved) and e.name == "n1" for e in events)


async def test_rescans_publish_only_changes_and_a_vanished_gpu_is_a_new_generation(bus: Bus, capture_file: Path) -> None:
    stop = asyncio.Event()
    config = Config(source="replay", replay=str(capture_file), node="h200", interval=0.1, mig=False)
    task = asyncio.create_task(serve(bus, config, stop))

    async def gpus(names: set[str], generation: int):
        async def check():
            slices = (await current(bus))[0]
            found = {d.name for e in slices.values() for d in e.slice.spec.devices}
            gens = {e.slice.spec.pool.generation for e in slices.values()}
            return found == names and gens == {generation}

        return check

    await until(await gpus({"gpu-0", "gpu-1"}, 1))
    seq = await last_seq(bus)
    await asyncio.sleep(0.5)  # several rescans of an unchanged node
    assert await last_seq(bus) == seq, "an unchanged node must not publish again"

    edit(capture_file, lambda d: d["devices"].pop(1))  # gpu-1 falls off the bus
    await until(await gpus({"gpu-0"}, 2))

    edit(capture_file, lambda d: d["devices"][0].update(remappedRows=[0, 2, 0, 1]))  # failed row remap

    async def tainted():
        slices = (await current(bus))[0]
        taints = [(t.key, t.value) for e in slices.values() for d in e.slice.spec.devices for t in d.taints]
        return taints == [(A.TAINT_UNHEALTHY, "row-remap-failure")] and {e.slice.spec.pool.generation for e in slices.values()} == {3}

    await until(tainted)

    edit(capture_file, lambda d: d["devices"][0].update(remappedRows=[0, 0, 0, 0]))  # repaired: the taint goes
    await until(await gpus({"gpu-0"}, 4))
    slices = (await current(bus))[0]
    assert not any(d.taints for e in slices.values() for d in e.slice.spec.devices)

    capture_file.write_text("{broken")  # a failed scan keeps the published slices
    await asyncio.sleep(0.4)
    assert await (await gpus({"gpu-0"}, 4))()
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_a_restart_continues_the_generation_and_cleans_leftovers(bus: Bus, capture_file: Path) -> None:
    # What a crashed earlier run left on the bus: generation 5, and a slice this run will not have.
    old = build_slices(read_inventory(ReplaySource.from_file(capture_file), "h200"), generation=5)
    leftover = msgspec.structs.replace(old[1], metadata=ObjectMeta(name="h200-gpu-9"))
    for s in [*old, leftover]:
        await bus.publish(ev.ResourceSlicePublished(slice=s))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, Config(source="replay", replay=str(capture_file), node="h200", interval=60), stop))

    async def recovered():
        slices, removed, _ = await current(bus)
        return (
            set(slices) == {"h200-gpu-0", "h200-gpu-1"}
            and {e.slice.spec.pool.generation for e in slices.values()} == {6}
            and [r.name for r in removed] == ["h200-gpu-9"]
        )

    await until(recovered)
    stop.set()
    await asyncio.wait_for(task, 10)


def test_config_mistakes_are_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DRALLOC_DISCOVERY_SOURCE", "profile")
    monkeypatch.setenv("DRALLOC_DISCOVERY_PROFILE", "h900")
    with pytest.raises(ValueError, match="hardware profile 'h900'"):
        Config.from_env()
    monkeypatch.setenv("DRALLOC_DISCOVERY_PROFILE", "l40s-pcie")
    monkeypatch.setenv("DRALLOC_DISCOVERY_INTERVAL", "soon")
    with pytest.raises(ValueError, match="DRALLOC_DISCOVERY_INTERVAL"):
        Config.from_env()
    monkeypatch.delenv("DRALLOC_DISCOVERY_INTERVAL")
    assert Config.from_env(node="x").profile == "l40s-pcie"
    with pytest.raises(ValueError, match="source 'fleet' needs"):
        Config.from_env(source="fleet")
    with pytest.raises(ValueError, match="layout"):
        Config.from_env(layout="1.33")


async def test_a_fleet_file_publishes_every_node(bus: Bus, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {profile: gb200-nvl72, count: 20}\n- {profile: l40s-pcie, count: 5}\n")
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, Config(source="fleet", fleet=str(fleet)), stop))

    async def all_nodes():
        slices, _, nodes = await current(bus)
        return len(nodes) == 25 and len(slices) == 50

    await until(all_nodes)
    nodes = (await current(bus))[2]
    assert nodes["gb200-nvl72-17"].metadata.labels[A.LABEL_RACK] == "gb200-nvl72-rack-0"
    assert nodes["gb200-nvl72-18"].metadata.labels[A.LABEL_RACK] == "gb200-nvl72-rack-1"
    stop.set()
    await asyncio.wait_for(task, 10)
    assert (await current(bus))[0] == {}


async def test_nvml_source_without_nvml_exits_non_zero(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_library() -> None:  # as on a machine without the driver (also where NVML works)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(SystemExit) as exc:
        await serve(bus, Config(source="nvml", node="x"), asyncio.Event())
    assert exc.value.code == 1
    assert (await current(bus))[0] == {}
