"""--usage right-sizing: the smallest MIG profile that holds the peak with the margin; nothing without data."""

from __future__ import annotations

import pytest
from migrate_helpers import EXAMPLES, allocate, documents, migrate

from dralloc.migrate.usage import MARGIN, Peak, UsageFileError, fit, parse

HEADER = "namespace,pod,container,peak_memory_mib,peak_utilization\n"


def request_of(text: str, usage: str, tmp_path):
    path = tmp_path / "usage.csv"
    path.write_text(usage)
    result = migrate(text, usage_path=str(path))
    return result, documents(result.stdout)


def test_smallest_profile_holding_memory_and_compute_with_the_margin():
    small = fit(Peak(7600, 9))  # 9120 MiB, 10.8%: 1g.10gb (9984 MiB, 16/132 SMs) on H100
    assert ("NVIDIA H100 80GB HBM3", "1g.10gb") in small.profiles
    assert ("NVIDIA H200", "1g.18gb") in small.profiles
    busier = fit(Peak(7600, 20))  # 24%: 1g.10gb (12%) and 1g.20gb (19.7%) are too slow, 2g.20gb (24.2%) fits
    assert ("NVIDIA H100 80GB HBM3", "2g.20gb") in busier.profiles
    bigger = fit(Peak(30000, 10))  # 36000 MiB: 3g.40gb on H100, 2g.35gb on H200 (33280 MiB) is too small
    assert ("NVIDIA H100 80GB HBM3", "3g.40gb") in bigger.profiles and ("NVIDIA H200", "3g.71gb") in bigger.profiles
    assert isinstance(fit(Peak(70000, 10)), str)  # 84000 MiB: only the whole H200 holds it -> no partition
    assert isinstance(fit(Peak(1000, 95)), str)  # compute-bound: needs the whole GPU
    assert MARGIN == 0.2


def test_a_right_sized_container_gets_a_mig_device_and_the_reason_is_reported(tmp_path):
    text = (EXAMPLES / "vllm-deployment.yaml").read_text()
    result, out = request_of(text, HEADER + "inference,vllm-llama3-7c9d8f6b5-x2kqp,vllm,7600,9\n", tmp_path)
    # 9120 MiB: the 1g.10gb slice first (hardware isolation), then a 9 GiB share, then the whole GPU
    mig, share, whole = out[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert (share["name"], share["deviceClassName"], share["capacity"]) == ("share", "gpu.nvidia.com", {"requests": {"memory": "9Gi"}})
    assert (mig["name"], mig["deviceClassName"], mig["count"]) == ("mig", "mig.nvidia.com", 1)
    assert (whole["name"], whole["deviceClassName"], whole["count"]) == ("gpu", "gpu.nvidia.com", 1)
    (change,) = result.report.changes
    assert "1 GPU -> MIG 1g.10gb on NVIDIA H100 80GB HBM3, else a share of a GPU (9Gi of its memory)" in change
    assert "7600 MiB" in change and "20% headroom" in change
    # the example's product label keeps it on H100; no GPU there is shareable, so the slice
    ((n, node, devices),) = allocate(out).values()
    assert n == 1 and node.startswith("h100-sxm-mig") and "-mig-1g10gb-" in devices[0]


def test_nothing_is_right_sized_without_data(tmp_path):
    text = (EXAMPLES / "vllm-deployment.yaml").read_text()
    with_other_rows, out = request_of(text, HEADER + "inference,other,vllm,100,1\nprod,vllm-llama3-x,vllm,100,1\n", tmp_path)
    assert with_other_rows.report.changes == []
    assert out[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert migrate(text).stdout == with_other_rows.stdout


def test_multi_gpu_and_busy_containers_keep_whole_gpus_with_a_reason(tmp_path):
    text = (EXAMPLES / "vllm-deployment.yaml").read_text() + "---\n" + (EXAMPLES / "pytorchjob.yaml").read_text()
    usage = HEADER + "inference,vllm-llama3-abcde,vllm,30500,85\ntraining,llama-finetune-worker-0,pytorch,100,1\n"
    result, out = request_of(text, usage, tmp_path)
    assert all(
        r["exactly"]["deviceClassName"] == "gpu.nvidia.com"
        for d in out
        if d["kind"] == "ResourceClaimTemplate"
        for r in d["spec"]["spec"]["devices"]["requests"]
    )
    assert any("needs a whole GPU" in c for c in result.report.changes)
    assert any("kept 8 whole GPUs" in c for c in result.report.changes)


def test_dcgm_column_names_and_ratio_are_accepted():
    usage = parse(
        "exported_namespace,exported_pod,exported_container,DCGM_FI_DEV_FB_USED,DCGM_FI_PROF_GR_ENGINE_ACTIVE\na,w-1,c,100,0.5\na,w-2,c,300,0.25\n", "u.csv"
    )
    assert usage.peak("a", "w", "c") == Peak(300, 50)
    assert usage.peak("a", "x", "c") is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("namespace,pod,container,peak_memory_mib\n", "no utilization column"),
        (HEADER + "a,w,c,10\n", "line 2: 4 fields"),
        (HEADER + "a,w,c,-5,1\n", "non-negative"),
        (HEADER + "a,w,c,5,nan\n", "non-negative"),
        (HEADER + "a,w,c,5,140\n", "more than 100%"),
        (HEADER + "a,,c,5,10\n", "must not be empty"),
    ],
)
def test_bad_usage_files_name_the_line(text, message):
    with pytest.raises(UsageFileError, match=message):
        parse(text, "u.csv")


def test_right_sizing_respects_the_gpu_models_the_labels_select(tmp_path):
    text = (EXAMPLES / "vllm-deployment.yaml").read_text()
    usage = HEADER + "inference,vllm-llama3-1,vllm,7600,9\n"
    l40s = text.replace("NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S")  # no MIG on an L40S: a share, or its whole GPU
    result, out = request_of(l40s, usage, tmp_path)
    assert [o["name"] for o in out[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]] == ["share", "gpu"]
    assert "select no MIG-capable GPU model" in result.report.changes[0]
    ((_, node, _),) = allocate(out).values()  # no shareable GPU in this fleet: the whole L40S
    assert node.startswith("l40s")
    h100 = request_of(text, usage, tmp_path)[1][0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]
    assert "NVIDIA H200" not in h100["selectors"][-1]["cel"]["expression"]  # only the labelled model's profile


def test_a_right_sized_container_falls_back_to_a_whole_gpu(tmp_path):
    text = (EXAMPLES / "vllm-deployment.yaml").read_text().replace("nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.family: hopper")
    _, out = request_of(text, HEADER + "inference,vllm-llama3-1,vllm,7600,9\n", tmp_path)
    ((n, node, devices),) = allocate(out, [("h100-sxm", 1)]).values()  # H100s published without MIG partitions
    assert n == 1 and node == "h100-sxm-0" and "-mig-" not in devices[0]
