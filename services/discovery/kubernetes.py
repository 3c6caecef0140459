"""Writing the node's ResourceSlices to a Kubernetes API, as a DRA driver's kubelet plugin does.

Optional (`DRALLOC_DISCOVERY_KUBERNETES=true`): the bus stays the primary
path. Create or replace each slice, delete the removed ones; an API error is
logged in one line and the next change tries again, the publisher goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException, ResourceV1Api

from dralloc.kube import KubeSettings, api_client, describe
from dralloc.schemas.resource import ResourceSlice, to_builtins

log = logging.getLogger("dralloc.discovery.kubernetes")


class KubernetesSlices:
    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self.api = ResourceV1Api(client)

    @classmethod
    async def connect(cls, settings: KubeSettings | None = None) -> KubernetesSlices:
        return cls(await api_client(settings or KubeSettings.from_env(), "discovery"))

    async def close(self) -> None:
        await self.client.close()

    async def apply(self, slices: Sequence[ResourceSlice], removed: Sequence[tuple[str, str, str]]) -> None:
        for s in slices:
            body = to_builtins(s)
            name = s.metadata.name
            try:
                status, answer = await _call(self.api.create_resource_slice(body, _preload_content=False))  # type: ignore[arg-type]  # the client sends a dict body as is; the stub names the model only
                if status == 409:  # an earlier run's slice: replace it at its resourceVersion
                    status, answer = await _call(self.api.read_resource_slice(name, _preload_content=False))
                    if status == 200:
                        body["metadata"]["resourceVersion"] = answer["metadata"]["resourceVersion"]
                        status, answer = await _call(self.api.replace_resource_slice(name, body, _preload_content=False))  # type: ignore[arg-type]  # the client sends a dict body as is; the stub names the model only
                if status >= 300:
                    log.error("kubernetes: ResourceSlice %s: %s %s", name, status, answer.get("message", ""))
            except (TimeoutError, ApiException, aiohttp.ClientError, OSError) as exc:
                log.error("kubernetes: ResourceSlice %s: %s", name, describe(exc) if isinstance(exc, ApiException) else exc)
        for _driver, _pool, name in removed:
            try:
                status, answer = await _call(self.api.delete_resource_slice(name, _preload_content=False))
                if status >= 300 and status != 404:
                    log.error("kubernetes: deleting ResourceSlice %s: %s %s", name, status, answer.get("message", ""))
            except (TimeoutError, ApiException, aiohttp.ClientError, OSError) as exc:
                log.error("kubernetes: deleting ResourceSlice %s: %s", name, describe(exc) if isinstance(exc, ApiException) else exc)


async def _call(request: Awaitable[Any]) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a raw (`_preload_content=False`) call, which does not raise on an error status."""
    response = await request
    try:
        return response.status, json.loads(await response.read() or b"{}")
    except ValueError:
        return response.status, {}
