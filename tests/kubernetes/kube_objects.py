"""The Kubernetes objects the claim-path tests apply to the emulated API server (test_kube_e2e.py,
test_kube_source.py): one DeviceClass, node-0's ResourceSlice, a ResourceClaim asking for one device
of the class. One definition, so that the source's tests and the end-to-end ones speak of the same
cluster."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.example.com"

CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
}


def node_slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """node-0's only ResourceSlice (pool node-0, generation 1) of the class's driver, publishing `devices`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-0-gpu"},
        "spec": {"driver": DRIVER, "nodeName": "node-0", "pool": {"name": "node-0", "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }


def claim(name: str, namespace: str = "default", *, metadata: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A ResourceClaim for one device of the class; `metadata` adds to its metadata (e.g.
    ownerReferences), `extra` to the object (e.g. a status)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, **(metadata or {})},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        **extra,
    }
