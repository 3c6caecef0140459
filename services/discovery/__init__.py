"""Node discovery: what a node has, published as `resource.k8s.io/v1` ResourceSlices.

The pieces, each with one job:
- `inventory`: the plain description of a node (GPUs, MIG profile tables, NICs,
  topology) that every source produces and the slice builder reads;
- `nvml` (real hardware through `pynvml`) and `replay` (a captured NVML
  inventory JSON) produce it from a machine; `profiles` simulates it from a
  hardware profile; `fleet` simulates thousands of nodes;
- `slices` turns an inventory into ResourceSlices (NVIDIA's `gpu.nvidia.com`
  attribute names, MIG as partitionable devices, both counter layouts, split
  at the API limits); `attributes` holds every name it publishes;
- `health` turns scans into device taints; `service` is the bus shell that
  publishes on change and withdraws on shutdown.
"""
