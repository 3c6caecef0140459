"""Whole GPUs shared through consumable capacity (KEP-5075): dralloc's example, not NVIDIA's.

NVIDIA's DRA driver publishes no device with `allowMultipleAllocations`
(github.com/NVIDIA/k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin/deviceinfo.go`
`GpuInfo.GetDevice` and `partitions.go` `fullGpuCapacity`: a GPU's only
capacity is `memory`, no request policy); it shares a GPU through a claim's
`GpuConfig` (time-slicing or MPS, `api/nvidia.com/resource/v1beta1/sharing.go`),
which the scheduler does not count. A fleet entry with `sharing: memory`
(`fleet.py`) shows what consumable capacity would buy: its nodes' whole GPUs
that are not MIG-partitionable become multi-allocatable, each claim consuming
the `memory` it asks for (`capacity.requests.memory`) and nothing else; a
request that asks for no memory consumes all of it (the policy's default), so a
whole-GPU claim still has its GPU to itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from dralloc.discovery import attributes as A
from dralloc.schemas.resource import CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceCapacity, ResourceSlice

SHARING_MODES = ("memory",)
"""What a fleet entry's `sharing` may say."""

MIN_SHARE = "1Gi"
"""The smallest share of a GPU's memory a claim may take."""


def share_memory(slices: Iterable[ResourceSlice]) -> list[ResourceSlice]:
    """The slices with their whole, unpartitioned GPUs multi-allocatable by memory (new objects:
    a profile's devices are shared between nodes and never mutated)."""
    out = []
    for s in slices:
        if s.spec.driver != A.GPU_DRIVER:
            out.append(s)
            continue
        devices = []
        for d in s.spec.devices:
            kind = d.attributes.get(A.TYPE)
            memory = d.capacity.get("memory")
            if kind is None or kind.string != "gpu" or d.consumes_counters or memory is None:
                devices.append(d)  # MIG-partitionable GPUs and their slices stay as they are
                continue
            policy = CapacityRequestPolicy(
                default=memory.value,
                valid_range=CapacityRequestPolicyRange(min=MIN_SHARE, max=memory.value, step="1Mi"),
            )
            capacity = {**d.capacity, "memory": DeviceCapacity(value=memory.value, request_policy=policy)}
            devices.append(msgspec.structs.replace(d, allow_multiple_allocations=True, capacity=capacity))
        out.append(msgspec.structs.replace(s, spec=msgspec.structs.replace(s.spec, devices=devices)))
    return out
