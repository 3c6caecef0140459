"""Publish only on change: the publisher's decisions, without a bus."""

from __future__ import annotations

from dralloc.discovery import attributes as A
from dralloc.discovery.profiles import simulate
from dralloc.discovery.publisher import Publisher


def test_generation_bumps_only_on_change_and_vanished_gpus_are_gone() -> None:
    publisher = Publisher()
    first = publisher.update(simulate("h200-sxm-mig", "n1"))
    assert first is not None and first.generation == 1 and len(first.publish) == 6 and first.remove == []
    assert first.node is not None and first.node.metadata.name == "n1"
    assert publisher.update(simulate("h200-sxm-mig", "n1")) is None  # same scan: nothing to send

    # gpu-6 and gpu-7 vanish: a new generation, every slice re-sent, none of them naming them.
    inventory = simulate("h200-sxm-mig", "n1")
    del inventory.gpus[6:]
    second = publisher.update(inventory)
    assert second is not None and second.generation == 2
    assert {s.spec.pool.generation for s in second.publish} == {2}
    names = {d.name for s in second.publish for d in s.spec.devices}
    assert "gpu-5" in names and not any(n.split("-mig-")[0] in ("gpu-6", "gpu-7") for n in names)
    assert {c.name for s in second.publish for c in s.spec.shared_counters} == {f"gpu-{i}-counter-set" for i in range(6)}
    # Two MIG GPUs (26 devices each) per slice of <= 64: 6 GPUs need 3 device slices, not 4; one is removed.
    assert second.remove == [("gpu.nvidia.com", "n1", "n1-gpu-4")]
    assert {s.spec.pool.resource_slice_count for s in second.publish if s.spec.driver == A.GPU_DRIVER} == {4}


def test_taint_is_a_change_and_node_labels_alone_resend_only_the_node() -> None:
    publisher = Publisher(layout="1.34")
    publisher.update(simulate("l40s-pcie", "n1"))
    sick = simulate("l40s-pcie", "n1")
    sick.gpus[3].taints.append((A.TAINT_UNHEALTHY, "ecc-uncorrected-errors"))
    update = publisher.update(sick)
    assert update is not None and update.generation == 2 and update.node is None
    relabelled = simulate("l40s-pcie", "n1")
    relabelled.gpus[3].taints.append((A.TAINT_UNHEALTHY, "ecc-uncorrected-errors"))
    relabelled.labels["extra"] = "x"
    only_node = publisher.update(relabelled)
    assert only_node is not None and only_node.publish == [] and only_node.node is not None


def test_adopt_continues_above_an_earlier_run_and_withdraw_names_everything() -> None:
    publisher = Publisher()
    publisher.adopt(41, [("gpu.nvidia.com", "n1", "n1-gpu-9")])
    update = publisher.update(simulate("h100-sxm", "n1"))
    assert update is not None and update.generation == 42
    assert update.remove == [("gpu.nvidia.com", "n1", "n1-gpu-9")]
    assert publisher.withdraw() == [("dra.net", "n1", "n1-nic-0"), ("gpu.nvidia.com", "n1", "n1-gpu-0")]
    assert publisher.withdraw() == []
