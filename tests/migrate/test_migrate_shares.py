"""Right-sizing to a share of a GPU (KEP-5075 consumable capacity on `memory`), on fleets whose
`sharing: memory` entries publish multi-allocatable GPUs, and what `plan` counts for it."""

from __future__ import annotations

import msgspec
import pytest
from migrate_helpers import EXAMPLES, documents, migrate
from typer.testing import CliRunner

from dralloc.allocator.engine import Engine
from dralloc.cli import app
from dralloc.discovery.fleet import FleetError, build_fleet, load_fleet
from dralloc.migrate.plan import CLASSES, plan
from dralloc.migrate.usage import Peak, Share, share
from dralloc.schemas.resource import DeviceClass, ResourceClaim

HEADER = "namespace,pod,container,peak_memory_mib,peak_utilization\n"
L40S_VLLM = (EXAMPLES / "vllm-deployment.yaml").read_text().replace("NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S")


def _migrated(text: str, usage: str, tmp_path) -> tuple[list[str], list[dict]]:
    path = tmp_path / "usage.csv"
    path.write_text(HEADER + usage)
    result = migrate(text, usage_path=str(path))
    assert result.exit_code == 0, result.report.problems
    return result.report.changes, documents(result.stdout)


def _engine(fleet) -> Engine:
    engine = Engine()
    for cls in CLASSES:
        engine.apply(msgspec.convert(cls, DeviceClass))
    nodes = build_fleet(fleet)
    engine.inventory.register_nodes([name for name, _ in nodes])
    for _, slices in nodes:
        for s in slices:
            assert engine.apply(s) == []  # a valid pool: the request policy passes validation
    return engine


def _claims(template: dict, n: int) -> list[ResourceClaim]:
    return [msgspec.convert({"metadata": {"name": f"pod-{i}", "namespace": "inference"}, "spec": template["spec"]["spec"]}, ResourceClaim) for i in range(n)]


def test_a_share_holds_the_peak_plus_the_margin_in_whole_gib_for_light_containers():
    assert share(Peak(3000, 5)) == Share(4, 3600, 6.0)  # 3600 MiB -> 4 GiB
    assert share(Peak(7600, 9)).memory_mib == 9 * 1024
    assert isinstance(share(Peak(3000, 30)), str)  # 36% of the engines: time-slicing would starve it or its neighbours


@pytest.mark.parametrize(
    "text, memory, names",
    [
        # H100 by label: a slice fits, so the slice first (isolation), the share second, the whole GPU last
        ((EXAMPLES / "vllm-deployment.yaml").read_text(), 7600, ["mig", "share", "gpu"]),
        ((EXAMPLES / "vllm-deployment.yaml").read_text(), 20000, ["mig", "share", "gpu"]),
        # L40S by label: no MIG-capable model, the share first
        (L40S_VLLM, 7600, ["share", "gpu"]),
        # too much memory for any H100 slice (84000 MiB with the margin) yet light: the share, then the whole GPU
        ((EXAMPLES / "vllm-deployment.yaml").read_text(), 70000, ["share", "gpu"]),
    ],
)
def test_a_share_comes_first_only_where_no_slice_fits(tmp_path, text, memory, names):
    changes, docs = _migrated(text, f"inference,vllm-llama3-1,vllm,{memory},10\n", tmp_path)
    options = docs[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [o["name"] for o in options] == names
    (portion,) = [o for o in options if o["name"] == "share"]
    assert portion["capacity"] == {"requests": {"memory": f"{share(Peak(memory, 10)).memory_gib}Gi"}}
    assert portion["selectors"][-1] == {"cel": {"expression": "device.allowMultipleAllocations"}}
    assert "a share of a GPU" in changes[0]


def test_l40s_pods_share_one_gpu_where_the_fleet_shares_it(tmp_path):
    changes, docs = _migrated(L40S_VLLM, "inference,vllm-llama3-1,vllm,7600,9\n", tmp_path)
    assert "1 GPU -> a share of a GPU (9Gi of its memory)" in changes[0] and "no MIG: the pod's GPU labels select no MIG-capable" in changes[0]
    template = docs[0]
    shared = _engine([{"profile": "l40s-pcie", "count": 1, "sharing": "memory"}])
    outcomes = shared.allocate(_claims(template, 4))  # 4 x 9 GiB fit a 46068 MiB L40S
    results = [o.allocation.devices.results[0] for o in outcomes]
    assert {(r.pool, r.device) for r in results} == {(results[0].pool, "gpu-0")}
    assert len({r.share_id for r in results}) == 4 and all(r.consumed_capacity == {"memory": "9Gi"} for r in results)
    assert all(r.request == "vllm/share" for r in results)
    (fifth,) = shared.allocate(_claims(template, 5)[4:])  # 45 GiB (46080 MiB) would not fit: the next GPU
    assert fifth.allocation.devices.results[0].device == "gpu-1"
    # the same claims where no GPU is shareable: whole GPUs, one each
    whole = _engine([{"profile": "l40s-pcie", "count": 1}]).allocate(_claims(template, 2))
    assert [o.allocation.devices.results[0].request for o in whole] == ["vllm/gpu", "vllm/gpu"]
    assert len({o.allocation.devices.results[0].device for o in whole}) == 2


def test_a_whole_gpu_claim_on_a_shareable_gpu_keeps_it_to_itself():
    engine = _engine([{"profile": "l40s-pcie", "count": 1, "sharing": "memory"}])
    whole = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}
    (taken,) = engine.allocate([msgspec.convert({"metadata": {"name": "train", "namespace": "t"}, "spec": whole}, ResourceClaim)])
    assert taken.status == "allocated"
    small = {
        "devices": {"requests": [{"name": "s", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1, "capacity": {"requests": {"memory": "1Gi"}}}}]}
    }
    (refused,) = engine.allocate([msgspec.convert({"metadata": {"name": "s", "namespace": "t"}, "spec": small}, ResourceClaim)])
    assert refused.status != "allocated"  # the whole-GPU claim consumed all the memory (the policy's default)


def test_a_fleet_entry_names_a_known_sharing_mode():
    assert load_fleet([{"profile": "l40s-pcie", "count": 2, "sharing": "memory"}]).nodes[1].sharing == "memory"
    with pytest.raises(FleetError, match="sharing: 'compute' is not one of memory"):
        load_fleet([{"profile": "l40s-pcie", "count": 2, "sharing": "compute"}])


def test_plan_counts_shares_as_the_memory_they_hold(tmp_path):
    usage = tmp_path / "usage.csv"
    usage.write_text(HEADER + "inference,vllm-llama3-1,vllm,7600,9\n")
    workloads = tmp_path / "vllm.yaml"
    workloads.write_text(L40S_VLLM)
    fleet = [{"profile": "l40s-pcie", "count": 1, "sharing": "memory"}]
    result, _ = plan([str(workloads)], fleet, str(usage))
    assert (result["device_plugin_gpus"], result["dra_gpus"], result["gpus_saved"]) == (2, 1, 1)
    (driver,) = result["drivers"]
    assert driver["why"] == "GPU shares" and driver["dra_gpus"] == pytest.approx(2 * 9 * 1024 / 46068, abs=0.01)
    assert (result["dra_pods_on_shares"], result["dra_pods_on_mig"]) == (2, 0)
    # a whole-GPU pod on a shareable GPU holds all its memory: a whole GPU, not a share
    busy = tmp_path / "busy.csv"
    busy.write_text(HEADER + "inference,vllm-llama3-1,vllm,7600,90\n")
    whole, _ = plan([str(workloads)], fleet, str(busy))
    assert (whole["dra_gpus"], whole["dra_pods_on_shares"], whole["drivers"][0]["why"]) == (2, 0, "whole GPUs")
    without, _ = plan([str(workloads)], [{"profile": "l40s-pcie", "count": 1}], str(usage))
    assert without["dra_gpus"] == 2 and without["drivers"][0]["why"] == "whole GPUs"


def test_the_table_and_the_chart_show_the_shares(tmp_path):
    (tmp_path / "usage.csv").write_text(HEADER + "inference,vllm-llama3-1,vllm,7600,9\n")
    (tmp_path / "vllm.yaml").write_text(L40S_VLLM)
    (tmp_path / "fleet.yaml").write_text("- {profile: l40s-pcie, count: 1, sharing: memory}\n")
    args = ["plan", "-f", str(tmp_path / "vllm.yaml"), "--fleet", str(tmp_path / "fleet.yaml"), "--usage", str(tmp_path / "usage.csv")]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.stderr
    assert "pods on GPU shares" in table.stdout and "GPU shares" in table.stdout.split("why")[-1]
    svg = tmp_path / "plan.svg"
    drawn = CliRunner().invoke(app, [*args, "-o", "svg", "--chart-file", str(svg)])
    assert drawn.exit_code == 0 and "2 on GPU shares" in svg.read_text()
