"""Recording NVML's answers in the replay format: `dralloc discover --capture FILE`.

`RecordingSource` wraps a `Source` (normally `PynvmlSource`), passes every
query through and writes down its answer, or its error as
`{"error": "..."}`, under the keys `replay.ReplaySource` reads. Replaying the
file then asks the same questions and gets the same answers, so a machine
seen once can be discovered again anywhere (and the GPU check asserts that
live and replayed discovery publish identical slices).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dralloc.discovery.nvml import DeviceSource, GpuLost, QueryError, Source


def _record(container: dict[str, Any], key: str, query, convert=lambda v: v) -> Any:
    try:
        value = query()
    except QueryError as exc:
        container[key] = {"error": _error(exc)}
        raise
    container[key] = convert(value)
    return value


def _error(exc: QueryError) -> str:
    # pynvml's text for a lost GPU is "GPU is lost"; the replay recognises NVML's name for it.
    return f"NVMLError_GpuIsLost: {exc}" if isinstance(exc, GpuLost) and "GpuIsLost" not in str(exc) else str(exc)


class RecordingSource:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.capture: dict[str, Any] = {"devices": [], "pairs": []}
        self._devices: dict[int, RecordingDevice] = {}

    def driver_version(self) -> str:
        return _record(self.capture, "driverVersion", self.source.driver_version)

    def cuda_driver_version(self) -> int:
        return _record(self.capture, "cudaDriverVersion", self.source.cuda_driver_version)

    def device_count(self) -> int:
        return _record(self.capture, "deviceCount", self.source.device_count)

    def device(self, index: int) -> RecordingDevice:
        if index not in self._devices:
            data: dict[str, Any] = {"index": index}
            self.capture["devices"].append(data)
            self._devices[index] = RecordingDevice(self.source.device(index), data)
        return self._devices[index]

    def p2p_nvlink(self, a: int, b: int) -> int:
        pair: dict[str, Any] = {"a": a, "b": b}
        self.capture["pairs"].append(pair)
        return _record(pair, "p2pNvlink", lambda: self.source.p2p_nvlink(a, b))

    def close(self) -> None:
        self.source.close()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.capture, indent=1, sort_keys=True))


class RecordingDevice:
    def __init__(self, device: DeviceSource, data: dict[str, Any]) -> None:
        self.device = device
        self.data = data

    def _r(self, key: str, query, convert=lambda v: v) -> Any:
        return _record(self.data, key, query, convert)

    def name(self) -> str:
        return self._r("name", self.device.name)

    def uuid(self) -> str:
        return self._r("uuid", self.device.uuid)

    def minor(self) -> int:
        return self._r("minor", self.device.minor)

    def brand(self) -> int:
        return self._r("brand", self.device.brand)

    def architecture(self) -> int:
        return self._r("architecture", self.device.architecture)

    def cuda_compute_capability(self) -> tuple[int, int]:
        return self._r("cudaComputeCapability", self.device.cuda_compute_capability, list)

    def memory_total(self) -> int:
        return self._r("memoryInfo", self.device.memory_total, lambda v: {"total": v})

    def pci_bus_id(self) -> str:
        return self._r("pciInfo", self.device.pci_bus_id, lambda v: {"busId": v})

    def mig_mode(self) -> tuple[int, int]:
        return self._r("migMode", self.device.mig_mode, list)

    def mig_profile(self, index: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"profile": index}
        self.data.setdefault("migGpuInstanceProfiles", []).append(entry)
        try:
            info = self.device.mig_profile(index)
        except QueryError as exc:
            entry["error"] = _error(exc)
            raise
        entry.update(info)
        return info

    def mig_placements(self, profile_id: int) -> list[tuple[int, int]]:
        entry = next(e for e in self.data.get("migGpuInstanceProfiles", []) if e.get("id") == profile_id)
        return _record(entry, "placements", lambda: self.device.mig_placements(profile_id), lambda v: [{"start": s, "size": n} for s, n in v])

    def _link(self, link: int) -> dict[str, Any]:
        links = self.data.setdefault("nvlinks", [])
        for entry in links:
            if entry["link"] == link:
                return entry
        links.append({"link": link})
        return links[-1]

    def nvlink_state(self, link: int) -> int:
        return _record(self._link(link), "state", lambda: self.device.nvlink_state(link))

    def nvlink_remote_bus_id(self, link: int) -> str:
        return _record(self._link(link), "remoteBusId", lambda: self.device.nvlink_remote_bus_id(link))

    def fabric(self) -> dict[str, Any]:
        return self._r("gpuFabricInfo", self.device.fabric, dict)

    def sysfs(self) -> dict[str, str]:
        return self._r("sysfs", self.device.sysfs, dict)

    def health(self) -> dict[str, Any]:
        signals = self.device.health()
        self.data.update(signals)
        return signals
