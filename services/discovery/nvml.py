"""Reading a node through NVML: a `NodeInventory` from real hardware or a replayed capture.

`read_inventory(source, node)` is the one reader. It asks a `Source` (the
`PynvmlSource` here, over `nvidia-ml-py`; or `replay.ReplaySource`, which
answers from a captured inventory JSON) one query at a time. Any query that
fails (NotSupported, NoPermission, an unknown error) yields None and so no
attribute: it never stops the scan. Only an NVML that cannot be loaded or
initialised at all is fatal (`NvmlUnavailable`).

Names: a GPU is `gpu-<minor>` (the /dev/nvidia<minor> number, stable across
restarts and reboots, unlike the NVML index, which follows enumeration
order); without a minor number, `gpu-<pci bus id>`; without either, the
index (`gpu-nvml-index-<i>`), the only name left.

NVLink: GPUs whose P2P status over NVLink is OK (directly linked, or through
NVSwitches) are one domain; when P2P cannot be asked, GPUs linked directly
(an active link whose remote PCI device is another GPU) are. The fabric
clique (GB200 NVL72) comes from `nvmlDeviceGetGpuFabricInfo` once the fabric
state is "completed".
"""

from __future__ import annotations

import ctypes
import os
import uuid as _uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dralloc.discovery import attributes as A
from dralloc.discovery.health import assess
from dralloc.discovery.inventory import Gpu, MigProfile, NodeInventory
from dralloc.discovery.profiles.mig_tables import STANDARD_PLACEMENTS
from dralloc.discovery.sysfs import pcie_switch

T = TypeVar("T")

FABRIC_STATE_COMPLETED = 3
NVLINK_MAX_LINKS = 36
P2P_STATUS_OK = 0
MIG_PROFILE_COUNT = 18  # NVML_GPU_INSTANCE_PROFILE_COUNT


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialised: no driver, no library, no GPU access."""


class QueryError(Exception):
    """One NVML query failed (NotSupported, NoPermission, ...): that value is unknown."""


class GpuLost(QueryError):
    """NVML says the GPU has fallen off the bus."""


class DeviceSource(Protocol):
    def name(self) -> str: ...
    def uuid(self) -> str: ...
    def minor(self) -> int: ...
    def brand(self) -> int: ...
    def architecture(self) -> int: ...
    def cuda_compute_capability(self) -> tuple[int, int]: ...
    def memory_total(self) -> int: ...
    def pci_bus_id(self) -> str: ...
    def mig_mode(self) -> tuple[int, int]: ...
    def mig_profile(self, index: int) -> dict[str, Any]: ...
    def mig_placements(self, profile_id: int) -> list[tuple[int, int]]: ...
    def nvlink_state(self, link: int) -> int: ...
    def nvlink_remote_bus_id(self, link: int) -> str: ...
    def fabric(self) -> dict[str, Any]: ...
    def sysfs(self) -> dict[str, str]: ...
    def health(self) -> dict[str, Any]: ...


class Source(Protocol):
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def device_count(self) -> int: ...
    def device(self, index: int) -> DeviceSource: ...
    def p2p_nvlink(self, a: int, b: int) -> int: ...
    def close(self) -> None: ...


def ask(query: Callable[[], T]) -> T | None:
    """The answer, or None when NVML cannot give it. GpuLost is let through: it is a health fact."""
    try:
        return query()
    except GpuLost:
        raise
    except QueryError:
        return None


def ask_any(query: Callable[[], T]) -> T | None:
    """The answer, or None for any failure, a lost GPU included (queries about links and the system)."""
    try:
        return query()
    except QueryError:
        return None


def read_inventory(source: Source, node: str, *, mig: bool = True) -> NodeInventory:
    """What `source` says this node has. `mig`: publish MIG-capable GPUs as partitionable."""
    driver = ask_any(source.driver_version)
    cuda = ask_any(source.cuda_driver_version)
    inventory = NodeInventory(
        node=node,
        driver_version=A.semver(driver) if driver else None,
        cuda_driver_version=A.cuda_version(cuda) if cuda else None,
    )
    count = ask_any(source.device_count) or 0
    indices: list[int] = []
    for index in range(count):
        try:
            device = source.device(index)
        except QueryError:
            # No handle at all (fallen off the bus before we could ask, or not ours to see):
            # it is not published, so it vanishes from the next generation.
            continue
        inventory.gpus.append(_read_gpu(device, index, node, mig))
        indices.append(index)
    _nvlink_domains(source, inventory, indices)
    if inventory.gpus:
        inventory.labels[A.LABEL_PRODUCT] = A.label_value(inventory.gpus[0].product_name or "unknown")
        cliques = {g.clique for g in inventory.gpus if g.clique}
        if len(cliques) == 1:
            inventory.labels[A.LABEL_CLIQUE] = cliques.pop()
    return inventory


def _read_gpu(dev: DeviceSource, index: int, node: str, mig: bool) -> Gpu:
    minor = bus_id = None
    try:
        minor = ask(dev.minor)
        bus = ask(dev.pci_bus_id)
        bus_id = A.pci_bus_id(bus) if bus else None
        gpu = Gpu(name=_gpu_name(minor, bus_id, index), minor=minor, pci_bus_id=bus_id)
        gpu.uuid = ask(dev.uuid)
        gpu.product_name = ask(dev.name)
        brand = ask(dev.brand)
        gpu.brand = A.BRANDS.get(brand, str(brand)) if brand is not None else None
        arch = ask(dev.architecture)
        gpu.architecture = A.ARCHITECTURES.get(arch) if arch is not None else None
        cc = ask(dev.cuda_compute_capability)
        gpu.cuda_compute_capability = f"{cc[0]}.{cc[1]}.0" if cc else None
        gpu.memory_bytes = ask(dev.memory_total)
        _read_sysfs(gpu, ask(dev.sysfs), node)
        _read_fabric(gpu, ask(dev.fabric))
        if mig and ask(dev.mig_mode) is not None:
            gpu.mig_profiles = _read_mig_profiles(dev)
            if gpu.mig_profiles:
                gpu.memory_slices = max(s + n for p in gpu.mig_profiles for s, n in p.placements)
        reason = assess(ask(dev.health) or {})
        if reason:
            gpu.taints.append((A.TAINT_UNHEALTHY, reason))
        return gpu
    except GpuLost:
        # Still published, tainted: neither pretend it is fine nor drop it silently.
        return Gpu(name=_gpu_name(minor, bus_id, index), minor=minor, pci_bus_id=bus_id, taints=[(A.TAINT_UNHEALTHY, "gpu-lost")])


def _gpu_name(minor: int | None, bus_id: str | None, index: int) -> str:
    """`gpu-<minor>`; else `gpu-<bus id>`; only as a last resort (names may then move) the NVML index."""
    if minor is not None:
        return f"gpu-{minor}"
    return f"gpu-{A.dns_label(bus_id)}" if bus_id else f"gpu-nvml-index-{index}"


def _read_sysfs(gpu: Gpu, sysfs: dict[str, str] | None, node: str) -> None:
    if not sysfs:
        return
    try:
        numa = int(sysfs.get("numa_node", "-1"))
    except ValueError:
        numa = -1
    gpu.numa_node = numa if numa >= 0 else None
    realpath = sysfs.get("realpath")
    if realpath:
        gpu.pcie_root = A.pcie_root(realpath)
        switch = pcie_switch(realpath)
        gpu.pcie_switch = f"{node}/{switch}" if switch else None


def _read_fabric(gpu: Gpu, fabric: dict[str, Any] | None) -> None:
    if not fabric or fabric.get("state") != FABRIC_STATE_COMPLETED or fabric.get("status", 0) != 0:
        return
    cluster = fabric.get("clusterUuid")
    if cluster:
        gpu.clique = f"{cluster}.{fabric.get('cliqueId', 0)}"


def _read_mig_profiles(dev: DeviceSource) -> tuple[MigProfile, ...]:
    profiles: list[MigProfile] = []
    for index in range(MIG_PROFILE_COUNT):
        info = ask(lambda: dev.mig_profile(index))
        if not info or not info.get("instanceCount"):
            continue
        pid = info["id"]
        placements = ask(lambda: dev.mig_placements(pid)) or STANDARD_PLACEMENTS.get(pid, ())
        if not placements:
            continue
        profiles.append(
            MigProfile(
                id=pid,
                name=str(info["name"]).removeprefix("MIG "),
                multiprocessors=info["multiprocessorCount"],
                copy_engines=info["copyEngineCount"],
                decoders=info["decoderCount"],
                encoders=info["encoderCount"],
                jpeg_engines=info["jpegCount"],
                ofa_engines=info["ofaCount"],
                memory_mib=info["memorySizeMB"],
                placements=tuple((int(s), int(n)) for s, n in placements),
            )
        )
    return tuple(profiles)


def _nvlink_domains(source: Source, inventory: NodeInventory, indices: list[int]) -> None:
    """Group GPUs into NVLink domains (union-find over P2P-over-NVLink and direct links)."""
    gpus = inventory.gpus
    parent = list(range(len(gpus)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_bus = {g.pci_bus_id: i for i, g in enumerate(gpus) if g.pci_bus_id}
    active: list[bool | None] = []
    for i, index in enumerate(indices):
        dev = source.device(index)
        states = [ask_any(lambda: dev.nvlink_state(link)) for link in range(NVLINK_MAX_LINKS)]
        known = [s for s in states if s is not None]
        active.append(any(known) if known else None)
        for link, state in enumerate(states):
            if state:
                remote = ask_any(lambda: dev.nvlink_remote_bus_id(link))
                j = by_bus.get(A.pci_bus_id(remote)) if remote else None
                if j is not None:
                    parent[find(j)] = find(i)
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            if ask_any(lambda: source.p2p_nvlink(indices[i], indices[j])) == P2P_STATUS_OK:
                parent[find(j)] = find(i)
                active[i] = active[j] = True
    for i, gpu in enumerate(gpus):
        gpu.nvlink = active[i]
        members = [k for k in range(len(gpus)) if find(k) == find(i)]
        if gpu.nvlink and len(members) > 1:
            gpu.nvlink_domain = f"{inventory.node}/nvlink-{gpus[members[0]].name}"
        elif gpu.clique:
            gpu.nvlink_domain = gpu.clique  # multi-node NVLink: the domain spans nodes


# --- the real thing: pynvml ------------------------------------------------------------


class PynvmlSource:
    """NVML through `nvidia-ml-py`. Construct it to initialise NVML; `close()` shuts it down."""

    def __init__(self, sysfs_root: str = "/sys") -> None:
        try:
            import pynvml
        except ImportError as exc:  # the dependency is declared, but a slim image may lack it
            raise NvmlUnavailable(f"nvidia-ml-py (pynvml) is not installed: {exc}") from None
        self._nvml = pynvml
        self._sysfs = Path(sysfs_root)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot be initialised: {exc}") from None
        self._handles: dict[int, Any] = {}

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nvml.NVMLError_GpuIsLost as exc:
            raise GpuLost(str(exc)) from None
        except self._nvml.NVMLError as exc:
            raise QueryError(str(exc)) from None
        except (TypeError, AttributeError, ValueError, OSError) as exc:
            # A binding that does not match the installed library (a missing symbol, a changed
            # signature) is one unanswered query too, not a crash of the publisher.
            raise QueryError(f"{getattr(fn, '__name__', fn)}: {exc}") from None

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def driver_version(self) -> str:
        return _text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return self._call(self._nvml.nvmlSystemGetCudaDriverVersion)

    def device_count(self) -> int:
        return self._call(self._nvml.nvmlDeviceGetCount)

    def device(self, index: int) -> _PynvmlDevice:
        if index not in self._handles:
            self._handles[index] = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
        return _PynvmlDevice(self, self._handles[index])

    def p2p_nvlink(self, a: int, b: int) -> int:
        n = self._nvml
        return self._call(n.nvmlDeviceGetP2PStatus, self.device(a).handle, self.device(b).handle, n.NVML_P2P_CAPS_INDEX_NVLINK)


class _PynvmlDevice:
    def __init__(self, source: PynvmlSource, handle: Any) -> None:
        self._s = source
        self._n = source._nvml
        self.handle = handle

    def _q(self, fn: Callable[..., T], *args: Any) -> T:
        return self._s._call(fn, self.handle, *args)

    def name(self) -> str:
        return _text(self._q(self._n.nvmlDeviceGetName))

    def uuid(self) -> str:
        return _text(self._q(self._n.nvmlDeviceGetUUID))

    def minor(self) -> int:
        return self._q(self._n.nvmlDeviceGetMinorNumber)

    def brand(self) -> int:
        return self._q(self._n.nvmlDeviceGetBrand)

    def architecture(self) -> int:
        return self._q(self._n.nvmlDeviceGetArchitecture)

    def cuda_compute_capability(self) -> tuple[int, int]:
        major, minor = self._q(self._n.nvmlDeviceGetCudaComputeCapability)
        return major, minor

    def memory_total(self) -> int:
        return int(self._q(self._n.nvmlDeviceGetMemoryInfo).total)

    def pci_bus_id(self) -> str:
        return _text(self._q(self._n.nvmlDeviceGetPciInfo).busId)

    def mig_mode(self) -> tuple[int, int]:
        current, pending = self._q(self._n.nvmlDeviceGetMigMode)
        return current, pending

    def mig_profile(self, index: int) -> dict[str, Any]:
        info = self._q(self._n.nvmlDeviceGetGpuInstanceProfileInfo, index)
        fields = (
            "id",
            "sliceCount",
            "instanceCount",
            "multiprocessorCount",
            "copyEngineCount",
            "decoderCount",
            "encoderCount",
            "jpegCount",
            "ofaCount",
            "memorySizeMB",
        )
        result: dict[str, Any] = {f: int(getattr(info, f)) for f in fields}
        result["name"] = _text(getattr(info, "name", b"")) or f"profile-{index}"
        return result

    def mig_placements(self, profile_id: int) -> list[tuple[int, int]]:
        n = self._n
        array = (n.c_nvmlGpuInstancePlacement_t * 8)()
        count = ctypes.c_uint(len(array))
        self._q(n.nvmlDeviceGetGpuInstancePossiblePlacements, profile_id, array, ctypes.byref(count))
        return [(array[i].start, array[i].size) for i in range(count.value)]

    def nvlink_state(self, link: int) -> int:
        return int(self._q(self._n.nvmlDeviceGetNvLinkState, link))

    def nvlink_remote_bus_id(self, link: int) -> str:
        return _text(self._q(self._n.nvmlDeviceGetNvLinkRemotePciInfo, link).busId)

    def fabric(self) -> dict[str, Any]:
        info = self._n.c_nvmlGpuFabricInfo_t()
        self._q(self._n.nvmlDeviceGetGpuFabricInfo, ctypes.byref(info))
        return {
            "clusterUuid": str(_uuid.UUID(bytes=bytes(info.clusterUuid[:16]))),
            "status": int(info.status),
            "cliqueId": int(info.cliqueId),
            "state": int(info.state),
        }

    def sysfs(self) -> dict[str, str]:
        bus = A.pci_bus_id(self.pci_bus_id())
        path = self._s._sysfs / "bus" / "pci" / "devices" / bus
        if not path.exists():
            raise QueryError(f"{path} does not exist")
        result = {"realpath": os.path.realpath(path)}
        try:
            result["numa_node"] = (path / "numa_node").read_text().strip()
        except OSError:
            pass
        return result

    def health(self) -> dict[str, Any]:
        n = self._n
        signals: dict[str, Any] = {}
        for key, query in (
            ("remappedRows", lambda: self._q(n.nvmlDeviceGetRemappedRows)),
            ("retiredPagesPending", lambda: self._q(n.nvmlDeviceGetRetiredPagesPendingStatus)),
            ("eccVolatileUncorrected", lambda: self._q(n.nvmlDeviceGetTotalEccErrors, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)),
        ):
            value = ask(query)
            if value is not None:
                signals[key] = list(value) if isinstance(value, (tuple, list)) else value
        return signals


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
