"""Discovery's optional slice writer against the emulated API server, and the RBAC of its overlay."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
from kube_emulator import ApiServer
from test_kube_e2e import SLICE

from dralloc.discovery.kubernetes import KubernetesSlices
from dralloc.kube import KubeSettings, user_agent
from dralloc.schemas.resource import ResourceSlice

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
from kustomize_render import granted, render  # noqa: E402

INFRA = Path(__file__).resolve().parents[2] / "infra"


def calls_by(apiserver: ApiServer, service: str) -> set[tuple[str, str, str]]:
    verbs = {"POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}

    def verb(r: Any) -> str:
        method = r.method.value.upper()
        if method == "GET":
            return "watch" if r.params.get("watch") in ("true", "True", "1") else ("get" if r.name else "list")
        return verbs[method]

    return {
        (r.resource.group, r.resource.plural, verb(r))
        for r in apiserver._requests
        if r.headers.get("User-Agent") == user_agent(service) and r.resource is not None
    }


async def test_slice_writer_creates_replaces_deletes_within_its_rbac(apiserver: ApiServer) -> None:
    writer = await KubernetesSlices.connect(KubeSettings(server=str(apiserver.url).rstrip("/")))
    try:
        first = msgspec.convert(SLICE, ResourceSlice)
        await writer.apply([first], [])
        assert apiserver.read("resourceslices", None, "node-0-gpu")["spec"]["devices"] == SLICE["spec"]["devices"]
        changed = msgspec.structs.replace(first, spec=msgspec.structs.replace(first.spec, devices=first.spec.devices[:1]))
        await writer.apply([changed], [])  # exists already: read and replaced
        assert len(apiserver.read("resourceslices", None, "node-0-gpu")["spec"]["devices"]) == 1
        await writer.apply([], [("gpu.example.com", "node-0", "node-0-gpu")])
        assert apiserver.read("resourceslices", None, "node-0-gpu") is None
    finally:
        await writer.close()
    assert calls_by(apiserver, "discovery") == granted(render(INFRA / "publish-slices"), "dralloc-discovery")
