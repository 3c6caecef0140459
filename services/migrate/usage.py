"""Right-sizing from observed use: DCGM peak samples, and the MIG profile that fits them.

The usage file is a CSV with a header row. Columns (case-insensitive; DCGM
exporter's label and field names are accepted as aliases):

| column | aliases | meaning |
|---|---|---|
| `namespace` | `exported_namespace` | the workload's namespace (`default` when empty) |
| `workload` | `pod`, `exported_pod` | the workload's name, or one of its pods' (`vllm-7d9f-abcde` counts for `vllm`) |
| `container` | `exported_container` | the container |
| `peak_memory_mib` | `fb_used_mib`, `DCGM_FI_DEV_FB_USED` | peak framebuffer use, MiB |
| `peak_utilization` | `peak_utilisation`, `utilization`, `DCGM_FI_PROF_GR_ENGINE_ACTIVE` | peak graphics engine activity, % (0..100; the DCGM field name takes DCGM's ratio 0..1) |

Several rows for one container (samples, pods) count by their maximum.

A one-GPU container is moved to the smallest MIG profile that holds its peak
memory plus `MARGIN` (20%) and whose share of the GPU's multiprocessors covers
its peak activity plus the same margin, or to a share of a GPU (KEP-5075
consumable capacity: `memory` asked of a multi-allocatable GPU) that holds the
peak memory plus the margin in whole GiB, when its peak activity plus the margin
is at most `SHARE_MAX_PERCENT` (sharers time-slice the engines: none has
multiprocessors of its own; where a MIG slice fits too, the slice is tried
first and the share second). A container without data, asking for more than one
GPU, or whose need fits neither keeps its whole GPU.
The profiles are NVIDIA's tables for the MIG-capable GPUs dralloc models
(H100 80GB, H200, A100 80GB): the request selects, per GPU model, that model's
smallest fitting profile, so the claim is satisfiable on any of them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass

from dralloc.discovery.profiles import A100, H100, H200, GpuModel

MARGIN = 0.20
"""Headroom over the observed peaks, for memory and for compute."""

MIG_MODELS: tuple[GpuModel, ...] = (H100, H200, A100)

_COLUMNS = {
    "namespace": ("namespace", "exported_namespace"),
    "workload": ("workload", "pod", "exported_pod"),
    "container": ("container", "exported_container"),
    "memory": ("peak_memory_mib", "fb_used_mib", "dcgm_fi_dev_fb_used"),
    "utilization": ("peak_utilization", "peak_utilisation", "utilization", "utilisation", "dcgm_fi_prof_gr_engine_active"),
}
MAX_ROWS = 1_000_000


class UsageFileError(ValueError):
    """The usage file cannot be read; the message names the file, line and column."""


@dataclass(frozen=True, slots=True)
class Peak:
    memory_mib: float
    utilization: float
    """Percent of the whole GPU's engine time, 0..100."""


@dataclass(frozen=True, slots=True)
class Fit:
    """Where a container's peak fits: per GPU model, the smallest MIG profile."""

    profiles: tuple[tuple[str, str], ...]
    """(productName, profile), in MIG_MODELS order."""
    need_mib: int
    need_percent: float

    def selector(self) -> str:
        """CEL: a MIG device of one of the fitting (model, profile) pairs."""
        by_profile: dict[str, list[str]] = {}
        for product, profile in self.profiles:
            by_profile.setdefault(profile, []).append(product)
        attr = "device.attributes['gpu.nvidia.com']"
        terms = [f"{attr}.profile == '{profile}' && {attr}.productName in [{', '.join(repr(p) for p in products)}]" for profile, products in by_profile.items()]
        return terms[0] if len(terms) == 1 else " || ".join(f"({t})" for t in terms)

    def describe(self) -> str:
        return ", ".join(f"{profile} on {product}" for product, profile in self.profiles)


class Usage:
    """Peaks by (namespace, workload or pod, container)."""

    def __init__(self, peaks: Mapping[tuple[str, str, str], Peak]):
        self._peaks = dict(peaks)

    def peak(self, namespace: str | None, workload: str, container: str) -> Peak | None:
        """The container's peak over the rows of the workload itself and of its pods (`<workload>-...`)."""
        ns = namespace or "default"
        found = [p for (n, w, c), p in self._peaks.items() if n == ns and c == container and (w == workload or w.startswith(workload + "-"))]
        if not found:
            return None
        return Peak(max(p.memory_mib for p in found), max(p.utilization for p in found))


def parse(text: str, where: str) -> Usage:
    """The usage CSV (see the module doc); UsageFileError names the line and column of a bad value."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise UsageFileError(f"{where}: empty; expected a header row") from None
    except csv.Error as exc:
        raise UsageFileError(f"{where}: line 1: {exc}") from None
    names = [h.strip().lower() for h in header]
    index: dict[str, int] = {}
    for column, aliases in _COLUMNS.items():
        hits = [i for i, n in enumerate(names) if n in aliases]
        if not hits:
            raise UsageFileError(f"{where}: line 1: no {column} column (one of {', '.join(aliases)})")
        index[column] = hits[0]
    ratio = names[index["utilization"]] == "dcgm_fi_prof_gr_engine_active"
    peaks: dict[tuple[str, str, str], Peak] = {}
    try:
        for line, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if line > MAX_ROWS:
                raise UsageFileError(f"{where}: more than {MAX_ROWS} rows")
            if len(row) < len(names):
                raise UsageFileError(f"{where}: line {line}: {len(row)} fields, the header has {len(names)}")
            ns = row[index["namespace"]].strip() or "default"
            workload, container = row[index["workload"]].strip(), row[index["container"]].strip()
            if not workload or not container:
                raise UsageFileError(f"{where}: line {line}: workload and container must not be empty")
            memory = _number(row[index["memory"]], where, line, header[index["memory"]])
            util = _number(row[index["utilization"]], where, line, header[index["utilization"]]) * (100 if ratio else 1)
            if util > 100:
                raise UsageFileError(f"{where}: line {line}: {header[index['utilization']]}: {util:g}% is more than 100%")
            key = (ns, workload, container)
            old = peaks.get(key)
            peaks[key] = Peak(max(memory, old.memory_mib), max(util, old.utilization)) if old else Peak(memory, util)
    except csv.Error as exc:
        raise UsageFileError(f"{where}: line {reader.line_num}: {exc}") from None
    return Usage(peaks)


def _number(cell: str, where: str, line: int, column: str) -> float:
    try:
        value = float(cell.strip())
    except ValueError:
        raise UsageFileError(f"{where}: line {line}: {column}: expected a number, got {cell.strip()!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageFileError(f"{where}: line {line}: {column}: expected a non-negative number, got {cell.strip()!r}")
    return value


def fit(peak: Peak, models: tuple[GpuModel, ...] = MIG_MODELS) -> Fit | str:
    """The smallest MIG profile per GPU model (of `models`) that holds `peak` with the margin, or why none does."""
    need_mib = math.ceil(peak.memory_mib * (1 + MARGIN))
    need_percent = min(100.0, peak.utilization * (1 + MARGIN))
    if not models:
        return "the pod's GPU labels select no MIG-capable GPU model"
    chosen: list[tuple[str, str]] = []
    for model in models:
        whole = max(model.mig_profiles, key=lambda p: p.multiprocessors)
        candidates = [
            p
            for p in model.mig_profiles
            if "+" not in p.name  # media-extension profiles hold the same memory with extra engines
            and p is not whole
            and p.memory_mib >= need_mib
            and 100 * p.multiprocessors / whole.multiprocessors >= need_percent
        ]
        if candidates:
            best = min(candidates, key=lambda p: (p.memory_mib, p.multiprocessors, p.name))
            chosen.append((model.product_name, best.name))
    if not chosen:
        return f"peak {peak.memory_mib:g} MiB / {peak.utilization:g}% (+{MARGIN:.0%}: {need_mib} MiB / {need_percent:g}%) needs a whole GPU"
    return Fit(tuple(chosen), need_mib, need_percent)


SHARE_MAX_PERCENT = 25.0
"""A share of a GPU is offered only to a container whose peak activity plus the margin is at most
this: sharers time-slice the GPU's engines (none gets multiprocessors of its own, unlike MIG)."""


@dataclass(frozen=True, slots=True)
class Share:
    """A share of one GPU: its memory, in whole GiB (the capacity request)."""

    memory_gib: int
    need_mib: int
    need_percent: float

    @property
    def memory_mib(self) -> int:
        return self.memory_gib * 1024

    def quantity(self) -> str:
        return f"{self.memory_gib}Gi"


def share(peak: Peak) -> Share | str:
    """The share of a GPU that holds `peak` with the margin, or why a share does not suit it."""
    need_mib = math.ceil(peak.memory_mib * (1 + MARGIN))
    need_percent = min(100.0, peak.utilization * (1 + MARGIN))
    if need_percent > SHARE_MAX_PERCENT:
        return f"{need_percent:g}% of the engines is more than a share's {SHARE_MAX_PERCENT:g}%"
    return Share(max(1, math.ceil(need_mib / 1024)), need_mib, need_percent)
