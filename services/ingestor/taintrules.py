"""DeviceTaintRules from a cluster (resource.k8s.io/v1, Kubernetes 1.37) as bus events.

The generated client (kubernetes-asyncio 36) knows DeviceTaintRule only in the
alpha and beta versions; a 1.37 cluster serves it in ``resource.k8s.io/v1``, so
the list/watch call is made here on the v1 path, with the same arguments the
generated ``list_*`` methods take (what `kubernetes.Reflector` passes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client import ApiClient

from dralloc.ingestor.sources import SourceEvent
from dralloc.schemas import events as ev
from dralloc.schemas.resource import DeviceTaintRule

PATH = "/apis/resource.k8s.io/v1/devicetaintrules"

_QUERY = {
    "watch": "watch",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
}


def taint_rule_events(kind: str, rule: DeviceTaintRule) -> list[SourceEvent]:
    """A rule added or changed -> `DeviceTaintRulePublished`; deleted (or being deleted) -> `DeviceTaintRuleRemoved`."""
    if kind == "DELETED" or rule.metadata.deletion_timestamp:
        return [ev.DeviceTaintRuleRemoved(name=rule.metadata.name)]
    return [ev.DeviceTaintRulePublished(rule=rule)]


def lister(api: ApiClient) -> Callable[..., Awaitable[Any]]:
    """``list_device_taint_rule`` for ``resource.k8s.io/v1``: the keyword arguments of the generated
    methods (``watch``, ``resource_version``, ``allow_watch_bookmarks``, ``timeout_seconds``,
    ``_preload_content``, ``_request_timeout``); others are refused, not ignored."""

    async def list_device_taint_rule(**kwargs: Any) -> Any:
        preload = kwargs.pop("_preload_content", True)
        timeout = kwargs.pop("_request_timeout", None)
        unknown = kwargs.keys() - _QUERY.keys()
        if unknown:
            raise TypeError(f"list_device_taint_rule: unexpected arguments {sorted(unknown)}")
        query = [(_QUERY[k], v) for k, v in kwargs.items() if v is not None]
        return await api.call_api(
            PATH,
            "GET",
            {},
            query,
            {"Accept": "application/json"},
            body=None,
            post_params={},
            files={},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=preload,
            _request_timeout=timeout,
            collection_formats={},
        )

    return list_device_taint_rule
