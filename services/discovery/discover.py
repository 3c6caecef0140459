"""`dralloc discover`: the slices this node would publish, from NVML, a replay or a profile.

The command's core, apart from the CLI shell so it is callable from tests and
the service: `inventory_from(...)` picks the source, `render(...)` prints.
"""

from __future__ import annotations

import io
import json
import os
import socket
from typing import Any

import yaml

from dralloc.discovery.attributes import NIC_DRIVER, PCI_BUS_ID, PRODUCT
from dralloc.discovery.inventory import NodeInventory
from dralloc.discovery.nvml import PynvmlSource, read_inventory
from dralloc.discovery.profiles import simulate
from dralloc.discovery.record import RecordingSource
from dralloc.discovery.replay import ReplaySource
from dralloc.discovery.sysfs import read_nics
from dralloc.schemas.resource import ResourceSlice, to_builtins

OUTPUTS = ("yaml", "json", "table")


def default_node_name() -> str:
    """The node's name: `NODE_NAME` (set from the downward API in a DaemonSet), else the hostname."""
    return os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0].lower()


def inventory_from(
    *,
    profile: str | None,
    replay: str | None,
    node: str,
    mig: bool = True,
    nics: bool = False,
    capture: str | None = None,
) -> NodeInventory:
    """The node's inventory from a profile, a replayed capture, or (neither given) NVML.

    `nics`: with NVML, also publish this machine's physical NICs from sysfs (off by
    default: a cluster running DraNet publishes them already). `capture`: write every
    NVML answer to this file, in the format `--replay` reads.

    Raises `NvmlUnavailable`, `ReplayError` or `ValueError` (unknown profile) with a message for people.
    """
    if profile:
        return simulate(profile, node)
    source = ReplaySource.from_file(replay) if replay else PynvmlSource()
    recorder = RecordingSource(source) if capture else None
    try:
        inventory = read_inventory(recorder or source, node, mig=mig)
    finally:
        source.close()
    if recorder is not None and capture:
        recorder.save(capture)
    if nics and not replay:
        inventory.nics = read_nics(node)
    return inventory


def render(slices: list[ResourceSlice], output: str) -> str:
    """Slices as multi-document YAML (kubectl-appliable), a JSON v1 List, or a table for people."""
    # apiVersion and kind equal the Structs' defaults, which encoding omits; a manifest needs them.
    items = [to_builtins(s) for s in slices]
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2, sort_keys=True)
    if output == "yaml":
        return yaml.safe_dump_all(items, sort_keys=True)
    return _table(slices)


def _table(slices: list[ResourceSlice]) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ResourceSlices", show_lines=False)
    for column in ("slice", "driver", "device", "type", "product / profile", "memory", "counters", "topology"):
        table.add_column(column)
    for s in slices:
        if s.spec.shared_counters:
            names = ", ".join(c.name for c in s.spec.shared_counters)
            table.add_row(s.metadata.name, s.spec.driver, "", "counters", names, "", "", "")
        for d in s.spec.devices:
            attr: dict[str, Any] = {k: (v.string or v.version or v.int if v.bool is None else v.bool) for k, v in d.attributes.items()}
            what = attr.get("profile") or attr.get("productName") or attr.get(PRODUCT) or attr.get("ifName") or ""
            memory = d.capacity["memory"].value if "memory" in d.capacity else ""
            counters = ", ".join(c.counter_set for c in d.consumes_counters)
            topo = " ".join(f"{k.split('/')[-1]}={attr[k]}" for k in sorted(attr) if "/" in k and k not in (PCI_BUS_ID, PRODUCT))
            taints = " ".join(f"taint:{t.key}={t.value}" for t in d.taints)
            table.add_row(
                s.metadata.name,
                s.spec.driver,
                d.name,
                str(attr.get("type", "nic" if s.spec.driver == NIC_DRIVER else "")),
                str(what),
                str(memory),
                counters,
                f"{topo} {taints}".strip(),
            )
    console = Console(width=200, record=True, file=io.StringIO())  # recorded, not shown (was an unclosed devnull)
    console.print(table)
    return console.export_text()
