"""GPU health: NVML's health signals to a device-taint reason, or None when healthy.

The publisher rescans every interval; a GPU that turns unhealthy is
published with a `gpu.nvidia.com/unhealthy` NoSchedule taint whose value says
why (so new claims avoid it, running ones are left alone), and a GPU that
vanishes from NVML is removed from the slices in a new generation: the
inventory never claims a GPU that is not usable.

Signals (the keys of the replay capture): `remappedRows` = [correctable,
uncorrectable, pending, failure] (a pending remap needs a GPU reset, a
failed one means bad memory), `retiredPagesPending` (pre-Ampere page
retirement awaiting reset) and `eccVolatileUncorrected` (uncorrectable ECC
errors since the driver loaded, NVIDIA's XID 48 class). A signal NVML does not
support is simply absent.
"""

from __future__ import annotations

from typing import Any


def assess(signals: dict[str, Any]) -> str | None:
    """The first reason this GPU should not get new work, or None."""
    rows = signals.get("remappedRows")
    if isinstance(rows, (list, tuple)) and len(rows) >= 4:
        if rows[3]:
            return "row-remap-failure"
        if rows[2]:
            return "row-remap-pending"
    if signals.get("retiredPagesPending"):
        return "retired-pages-pending"
    ecc = signals.get("eccVolatileUncorrected")
    if isinstance(ecc, int) and ecc > 0:
        return "ecc-uncorrected-errors"
    return None
