"""The GPU check's comparison, run offline on the real H200 capture (NVML JSON vs nvidia-smi -q -x).

The two files were captured in different sessions of the VM (the GPU's UUID
differs between them), so the comparison must agree on everything but the
UUID, and must flag the UUID: that is the check catching a real difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dralloc.discovery.nvml import read_inventory
from dralloc.discovery.replay import ReplaySource
from dralloc.discovery.slices import build_slices

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from smi_compare import compare, disagreements, table  # noqa: E402


def test_comparison_on_the_real_capture(shared_dir) -> None:
    fixtures = shared_dir / "fixtures/hardware/h200-vm"
    capture = json.loads((fixtures / "nvml-inventory.json").read_text())
    slices = build_slices(read_inventory(ReplaySource(capture), "h200-vm"))
    xml = (fixtures / "nvidia-smi-q.xml").read_text()
    xml = xml[xml.index("<?xml") :]  # the file starts with the command line that made it
    rows, problems = compare(slices, xml, {"0000:00:06.0": "9.0"})
    assert problems == []
    assert len(rows) == 10 and "memory MiB" in table(rows)
    assert [(r[1], r[2], r[3]) for r in disagreements(rows)] == [
        ("uuid", "GPU-c0b9eed0-c7d9-df06-1232-faf2b741aae0", "GPU-292be603-ad89-3843-4b02-5c4ef53d13ec")
    ]
    values = {r[1]: r[3] for r in rows}
    assert values["memory MiB"] == 143771 and values["driverVersion"] == "580.159.4"
    assert values["MIG capable (mode Disabled)"] is True
    # Without MIG partitions published, the MIG row disagrees: the check sees it.
    plain = build_slices(read_inventory(ReplaySource(capture), "h200-vm", mig=False))
    assert ("MIG capable (mode Disabled)", True, False) in [(r[1], r[2], r[3]) for r in disagreements(compare(plain, xml, {})[0])]
