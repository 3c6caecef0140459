"""Kubernetes API access shared by the ingestor's source and the status writer's sink.

One place decides how to reach the API server (an explicit URL, the Pod's
service account, or a kubeconfig), names each service in its User-Agent (so
API server audit logs, and the RBAC test, can tell the services apart), and
turns the API's errors into one line a person can act on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import version as _dist_version
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration

from dralloc.errors import UsageError  # a configuration mistake is reported as the CLI reports usage errors


@dataclass(frozen=True, slots=True)
class KubeSettings:
    """Where the API server is. With nothing set: in-cluster config inside a Pod, else the kubeconfig."""

    server: str | None = None
    """An API server URL used without credentials (`kubectl proxy`, tests)."""
    kubeconfig: str | None = None
    context: str | None = None

    @classmethod
    def from_env(cls) -> KubeSettings:
        return cls(
            server=os.environ.get("DRALLOC_KUBE_SERVER") or None,
            kubeconfig=os.environ.get("KUBECONFIG") or None,
            context=os.environ.get("DRALLOC_KUBE_CONTEXT") or None,
        )


class KubeConfigError(UsageError):
    """No usable way to reach the API server: reported in one line when a service starts, never per event."""


def check_settings(settings: KubeSettings) -> None:
    """Fail now, with what to set, when no API server can be configured (before any event is consumed)."""
    if settings.server or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return
    kubeconfig = settings.kubeconfig or os.path.expanduser("~/.kube/config")
    if not all(os.path.isfile(path) for path in kubeconfig.split(os.pathsep) if path):
        raise KubeConfigError(
            f"no Kubernetes API to talk to: kubeconfig {kubeconfig} not found and not running in a Pod; "
            "set KUBECONFIG or DRALLOC_KUBE_SERVER (an API URL such as `kubectl proxy`'s)"
        )


async def api_client(settings: KubeSettings, service: str) -> ApiClient:
    """A kubernetes-asyncio client for `settings`; the caller closes it (``async with``)."""
    from kubernetes_asyncio import config as kube_config

    check_settings(settings)
    configuration = Configuration()
    try:
        if settings.server:
            configuration.host = settings.server.rstrip("/")
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and not settings.kubeconfig:
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            await kube_config.load_kube_config(config_file=settings.kubeconfig, context=settings.context, client_configuration=configuration)
    except kube_config.ConfigException as exc:
        raise KubeConfigError(f"Kubernetes configuration: {exc}") from None
    client = ApiClient(configuration)
    client.user_agent = user_agent(service)
    return client


async def body_of(call: Awaitable[Any]) -> bytes:
    """The body of a call made with ``_preload_content=False``, raising `ApiException` for an error status.

    Without preloading (how dralloc reads objects: straight into msgspec Structs,
    skipping the generated models), the client returns error responses instead
    of raising; this puts the usual exception back.
    """
    response = await call
    try:
        await ensure_ok(response)
        return await response.read()
    finally:
        response.release()


MERGE_PATCH = "application/merge-patch+json"


async def merge_patch(method: Callable[..., Awaitable[Any]], name: str, namespace: str, body: dict[str, Any]) -> bytes:
    """`body` as a JSON merge patch through a kubernetes-asyncio ``patch_namespaced_*`` `method` (the
    object's or a subresource's); the body the API server answered, raising `ApiException` for an
    error status. (The generated stubs omit ``_content_type``, which the client takes: hence `method`
    typed as any callable, and no type: ignore at each call.)"""
    return await body_of(method(name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False))


async def ensure_ok(response: Any) -> None:
    """Raise `ApiException` (status, reason, body) for a non-2xx streaming response."""
    if not 200 <= response.status <= 299:
        exc = ApiException(status=response.status, reason=response.reason)
        exc.body = await response.read()
        raise exc


def user_agent(service: str) -> str:
    return f"dralloc-{service}/{_dist_version('dralloc')}"


class Status(msgspec.Struct, kw_only=True):
    """The API server's error body (`meta/v1 Status`)."""

    code: int = 0
    reason: str = ""
    message: str = ""


def describe(exc: ApiException) -> str:
    """`409 Conflict: the object has been modified ...` from an API error."""
    status = decode_status(exc.body)
    reason = status.reason if status else exc.reason
    message = status.message if status else ""
    return f"{exc.status} {reason}: {message}".rstrip(": ")


def decode_status(body: Any) -> Status | None:
    if not body:
        return None
    try:
        return msgspec.json.decode(body if isinstance(body, bytes | str) else json.dumps(body), type=Status)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
