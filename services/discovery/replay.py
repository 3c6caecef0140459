"""An NVML `Source` that answers from a captured inventory JSON.

The capture format is `../shared/fixtures/hardware/h200-vm/nvml-inventory.json`:
system values at the top (`driverVersion`, `cudaDriverVersion`, `deviceCount`),
one object per GPU under `devices` with every query's answer or
`{"error": "NVMLError_NotSupported: ..."}`, and `pairs` for two-GPU queries
(`{"a": 0, "b": 1, "p2pNvlink": 0}`). A recorded error replays as that error,
a query that was not captured replays as "not captured": both become "no
attribute", exactly as on the machine. So the NVML reader is tested on real
answers, NotSupported included, without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dralloc.discovery.nvml import GpuLost, QueryError
from dralloc.manifests import read_text, why_unreadable
from dralloc.schemas.limits import json_problem


class ReplayError(ValueError):
    """The capture file cannot be read or is not an NVML inventory."""


def _answer(container: dict[str, Any], key: str) -> Any:
    if key not in container:
        raise QueryError(f"{key}: not captured")
    value = container[key]
    if isinstance(value, dict) and set(value) == {"error"}:
        message = str(value["error"])
        if "GpuIsLost" in message:
            raise GpuLost(message)
        raise QueryError(message)
    return value


class ReplaySource:
    def __init__(self, capture: dict[str, Any]) -> None:
        if not isinstance(capture, dict) or not isinstance(capture.get("devices"), list):
            raise ReplayError("not an NVML inventory capture: expected an object with a 'devices' list")
        self.capture = capture
        self._pairs = {frozenset((p.get("a"), p.get("b"))): p for p in capture.get("pairs", []) if isinstance(p, dict)}

    @classmethod
    def from_file(cls, path: str | Path) -> ReplaySource:
        try:
            text = read_text(path)
            if (problem := json_problem(text)) is not None:  # before json recurses through it
                raise ReplayError(problem)
            return cls(json.loads(text))
        except (OSError, UnicodeDecodeError) as exc:
            raise ReplayError(f"{path}: cannot read: {why_unreadable(exc)}") from None
        except json.JSONDecodeError as exc:
            raise ReplayError(f"{path}: not JSON: {exc}") from None
        except ReplayError as exc:
            raise ReplayError(f"{path}: {exc}") from None

    def close(self) -> None:
        pass

    def driver_version(self) -> str:
        return str(_answer(self.capture, "driverVersion"))

    def cuda_driver_version(self) -> int:
        return int(_answer(self.capture, "cudaDriverVersion"))

    def device_count(self) -> int:
        return len(self.capture["devices"])

    def device(self, index: int) -> ReplayDevice:
        return ReplayDevice(self.capture["devices"][index])

    def p2p_nvlink(self, a: int, b: int) -> int:
        pair = self._pairs.get(frozenset((a, b)))
        if pair is None:
            raise QueryError("pair not captured")
        return int(_answer(pair, "p2pNvlink"))


class ReplayDevice:
    def __init__(self, data: dict[str, Any]) -> None:
        if not isinstance(data, dict):
            raise ReplayError("a device entry must be an object")
        self.data = data

    def _get(self, key: str) -> Any:
        return _answer(self.data, key)

    def name(self) -> str:
        return str(self._get("name"))

    def uuid(self) -> str:
        return str(self._get("uuid"))

    def minor(self) -> int:
        return int(self._get("minor"))

    def brand(self) -> int:
        return int(self._get("brand"))

    def architecture(self) -> int:
        return int(self._get("architecture"))

    def cuda_compute_capability(self) -> tuple[int, int]:
        major, minor = self._get("cudaComputeCapability")
        return int(major), int(minor)

    def memory_total(self) -> int:
        return int(_answer(self._get("memoryInfo"), "total"))

    def pci_bus_id(self) -> str:
        return str(_answer(self._get("pciInfo"), "busId"))

    def mig_mode(self) -> tuple[int, int]:
        current, pending = self._get("migMode")
        return int(current), int(pending)

    def _profiles(self) -> list[dict[str, Any]]:
        return [p for p in self._get("migGpuInstanceProfiles") if isinstance(p, dict)]

    def mig_profile(self, index: int) -> dict[str, Any]:
        for entry in self._profiles():
            if entry.get("profile") == index:
                if "error" in entry:
                    raise QueryError(str(entry["error"]))
                return entry
        raise QueryError(f"profile {index}: not captured")

    def mig_placements(self, profile_id: int) -> list[tuple[int, int]]:
        for entry in self._profiles():
            if entry.get("id") == profile_id:
                placements = _answer(entry, "placements")
                return [(int(p["start"]), int(p["size"])) if isinstance(p, dict) else (int(p[0]), int(p[1])) for p in placements]
        raise QueryError(f"profile id {profile_id}: not captured")

    def _link(self, link: int) -> dict[str, Any]:
        for entry in self._get("nvlinks"):
            if isinstance(entry, dict) and entry.get("link") == link:
                return entry
        raise QueryError(f"nvlink {link}: not captured")

    def nvlink_state(self, link: int) -> int:
        return int(_answer(self._link(link), "state"))

    def nvlink_remote_bus_id(self, link: int) -> str:
        return str(_answer(self._link(link), "remoteBusId"))

    def fabric(self) -> dict[str, Any]:
        info = dict(self._get("gpuFabricInfo"))
        cluster = info.get("clusterUuid")
        if isinstance(cluster, str) and "-" in cluster and len(cluster.split("-")) >= 16:
            # The capture writes NVML's byte array as dash-separated hex bytes.
            import uuid

            info["clusterUuid"] = str(uuid.UUID(bytes=bytes(int(b, 16) for b in cluster.split("-")[:16])))
        return info

    def sysfs(self) -> dict[str, str]:
        return {k: str(v) for k, v in self._get("sysfs").items()}

    def health(self) -> dict[str, Any]:
        signals = {}
        for key in ("remappedRows", "retiredPagesPending", "eccVolatileUncorrected"):
            try:
                signals[key] = self._get(key)
            except QueryError:
                continue
        return signals
