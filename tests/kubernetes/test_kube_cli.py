"""`dralloc run ingestor|statuswriter` as processes, configured the way infra/ configures them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from kube_emulator import ApiServer
from kube_objects import CLASS, claim
from test_kube_e2e import SLICE, allocation_of

from dralloc.allocator import service as allocator
from dralloc.bus import Bus

DRALLOC = str(Path(sys.executable).parent / "dralloc")


def service_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "DRALLOC_", "OTEL_"))}
    env.pop("KUBECONFIG", None)
    env["HOME"] = "/nonexistent"  # no ~/.kube/config either
    return env | extra


async def start(args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(DRALLOC, "run", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def test_services_run_against_the_api_server(apiserver: ApiServer, nats_url: str) -> None:
    env = service_env(
        DRALLOC_KUBE_SERVER=str(apiserver.url).rstrip("/"),
        NATS_URL=nats_url,
        DRALLOC_INGESTOR_SOURCE="kubernetes",
        DRALLOC_INGESTOR_SLICES="true",
        DRALLOC_STATUSWRITER_SINK="kubernetes",
    )
    processes = [await start(["ingestor"], env), await start(["statuswriter"], env)]
    bus = await Bus.connect(nats_url, name="test")
    await bus.ensure_streams()
    stop = asyncio.Event()
    running = asyncio.create_task(allocator.serve(bus, allocator.Config(), stop))
    try:
        apiserver.apply(CLASS)
        apiserver.apply(SLICE)
        apiserver.apply(claim("a", "ml"))  # the Pod in ml uses it
        apiserver.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer", "namespace": "ml"},
                "spec": {
                    "containers": [{"name": "main", "image": "busybox"}],
                    "schedulingGates": [{"name": "dralloc.dev/allocate"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "a"}],
                },
            }
        )
        status = await allocation_of(apiserver, "a", timeout=30)
        assert status["allocation"]["devices"]["results"][0]["pool"] == "node-0"
        assert status["reservedFor"][0]["name"] == "trainer"
        async with asyncio.timeout(10):  # the ingestor lifts the gate once the Pod's claims are allocated
            while apiserver.read("pods", "ml", "trainer")["spec"].get("schedulingGates"):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await running
        await bus.close()
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(p.wait(), 15) for p in processes]
    assert codes == [0, 0]


async def test_statuswriter_without_kubernetes_config_says_what_to_set(bus: Bus, nats_url: str) -> None:
    # (`bus` made the streams, as the allocator does: the other services wait for them.)
    process = await start(["statuswriter", "--sink", "kubernetes"], service_env(NATS_URL=nats_url))
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    message = stderr.decode().strip().splitlines()[-1]
    assert message.startswith("dralloc: no Kubernetes API") and "KUBECONFIG" in message
    assert "Traceback" not in stderr.decode()
