"""Writing slices to a Kubernetes API: the real kubernetes-asyncio client over HTTP, against the emulator."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from kmock import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kubernetes"))
from kube_emulator import ApiServer  # noqa: E402

from dralloc.bus import Bus  # noqa: E402
from dralloc.discovery.service import Config, serve  # noqa: E402


@pytest.fixture
async def apiserver():
    async with ApiServer() as server, Server(server):
        yield server
        server.release_watches()
        server.close_watches()


def names(apiserver: ApiServer) -> dict[str, int]:
    return {o["metadata"]["name"]: o["spec"]["pool"]["generation"] for o in apiserver.objects_of("resourceslices")}


async def test_service_writes_its_slices_to_kubernetes_and_deletes_them_on_stop(bus: Bus, apiserver: ApiServer, monkeypatch) -> None:
    monkeypatch.setenv("DRALLOC_KUBE_SERVER", str(apiserver.url))
    # An earlier run's slice of the same name exists: it is replaced, not duplicated.
    stale = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "k1-gpu-0"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "k1", "pool": {"name": "k1", "generation": 0, "resourceSliceCount": 1}},
    }
    apiserver.apply(stale)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, Config(source="profile", profile="l40s-pcie", node="k1", kubernetes=True), stop))
    for _ in range(200):
        if names(apiserver) == {"k1-gpu-0": 1, "k1-nic-0": 1}:
            break
        await asyncio.sleep(0.05)
    assert names(apiserver) == {"k1-gpu-0": 1, "k1-nic-0": 1}
    [gpu_slice] = [o for o in apiserver.objects_of("resourceslices") if o["metadata"]["name"] == "k1-gpu-0"]
    assert len(gpu_slice["spec"]["devices"]) == 8 and gpu_slice["spec"]["driver"] == "gpu.nvidia.com"
    stop.set()
    await asyncio.wait_for(task, 10)
    assert names(apiserver) == {}


async def test_an_unreachable_api_server_is_logged_not_fatal(caplog) -> None:
    from kubernetes_asyncio.client import ApiClient, Configuration

    from dralloc.discovery.kubernetes import KubernetesSlices
    from dralloc.discovery.profiles import simulate
    from dralloc.discovery.slices import build_slices

    writer = KubernetesSlices(ApiClient(Configuration(host="http://127.0.0.1:9")))
    try:
        await writer.apply(build_slices(simulate("gb200-nvl72", "n")), [("gpu.nvidia.com", "n", "n-gpu-7")])
    finally:
        await writer.close()
    assert "kubernetes: ResourceSlice n-gpu-0" in caplog.text and "deleting ResourceSlice n-gpu-7" in caplog.text


async def test_kubernetes_asked_for_but_not_configured_is_a_clear_exit(bus: Bus, monkeypatch, caplog, tmp_path) -> None:
    monkeypatch.delenv("DRALLOC_KUBE_SERVER", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    with pytest.raises(SystemExit) as exc:
        await serve(bus, Config(source="profile", node="k2", kubernetes=True), asyncio.Event())
    assert exc.value.code == 2 and "cannot write slices to Kubernetes" in caplog.text
