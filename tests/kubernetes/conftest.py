"""Fixtures: the emulated API server on a real port and a real kubernetes-asyncio client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kmock import Server
from kube_emulator import ApiServer
from kubernetes_asyncio.client import ApiClient, Configuration


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServer]:
    async with ApiServer() as server, Server(server):
        yield server
        server.release_watches()
        server.close_watches()


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    config = Configuration(host=str(apiserver.url).rstrip("/"))
    async with ApiClient(config) as client:
        yield client
