"""The shell benchmark (#17 item 2): `benchmarks/allocator.py` (the allocator service alone, a process
against a real nats-server), once, small. Nothing here asserts a speed: the allocator decides every
claim exactly once and its CPU split adds up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import allocator  # noqa: E402


async def test_the_allocator_bench_decides_each_claim_once_and_splits_its_cpu():
    report = await allocator.run(count=40, rounds=1, timeout=120)
    (one,) = report["rounds"]
    assert one["claims_without_one_decision"] == 0
    assert one["allocator_us_per_claim"] > 0 and one["main_thread_us_per_claim"] > 0
    assert abs(one["allocator_us_per_claim"] - one["main_thread_us_per_claim"] - one["other_threads_us_per_claim"]) < 1.0


def test_the_allocator_bench_claims_are_the_pipelines_mix():
    claims = allocator.claims(20)
    classes = [c.claim.spec.devices.requests[0].exactly.device_class_name for c in claims]
    assert classes.count("mig.nvidia.com") == 2 and classes.count("gpu.nvidia.com") == 18
    assert len({c.claim.metadata.uid for c in claims}) == 20
