"""Writing the node's ResourceSlices to a Kubernetes API, as a DRA driver's kubelet plugin does.

Optional (`DRALLOC_DISCOVERY_KUBERNETES=true`): the bus stays the primary
path. Create or replace each slice, delete the removed ones; an API error is
logged in one line and the next change tries again, the publisher goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import msgspec
from kubernetes_asyncio.client import ApiClient, ApiException, ResourceV1Api

from dralloc.kube import KubeSettings, api_client, describe
from dralloc.schemas.resource import ResourceSlice

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
            body = {"apiVersion": s.api_version, "kind": s.kind, **msgspec.to_builtins(s)}
            name = s.metadata.name
            try:
                try:
                    await self.api.create_resource_slice(body, _preload_content=False)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    current = await self.api.read_resource_slice(name, _preload_content=False)
                    body["metadata"]["resourceVersion"] = json.loads(await current.read())["metadata"]["resourceVersion"]
                    await self.api.replace_resource_slice(name, body, _preload_content=False)
            except ApiException as exc:
                log.error("kubernetes: ResourceSlice %s: %s", name, describe(exc))
        for _driver, _pool, name in removed:
            try:
                await self.api.delete_resource_slice(name, _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:
                    log.error("kubernetes: deleting ResourceSlice %s: %s", name, describe(exc))
