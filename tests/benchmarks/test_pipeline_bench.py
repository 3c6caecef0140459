"""dralloc bench pipeline: claims through the submit path, each ending at the status writer's record,
a fleet with MIG nodes, the rate over a sustained window, and the bus-only ceiling of the same chain.

The pure parts (the claim mix, the fleet's size, the window arithmetic, the per-stage join) with made-up
inputs; the ceiling against a real nats-server; the whole benchmark once, small, through the CLI
(nats-server and the four services as processes). Nothing here asserts a speed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.cli import app
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.status import DEFAULT_BUCKET

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import ceiling  # noqa: E402
import pipeline  # noqa: E402
from pipeline import Record, Stored  # noqa: E402


def test_claims_pass_the_submit_path_and_every_tenth_asks_for_a_mig_slice(tmp_path):
    names = [f"c-{i}" for i in range(30)]
    paths = pipeline.Submitter(None, tmp_path).write(names, 10, 0)  # type: ignore[arg-type]  # (writing needs no bus)
    assert paths == [str(tmp_path / f"{name}.json") for name in names]
    problems: list[str] = []
    events = events_from_manifests(load_paths(paths), problems.append)
    assert problems == []
    assert [e.claim.metadata.name for e in events] == names
    classes = [e.claim.spec.devices.requests[0].exactly.device_class_name for e in events]
    assert classes.count("mig.nvidia.com") == 3 and classes.count("gpu.nvidia.com") == 27
    assert [i for i, c in enumerate(classes) if c == "mig.nvidia.com"] == [9, 19, 29]
    mig = events[9].claim.spec.devices.requests[0].exactly
    assert mig.selectors[0].cel.expression == pipeline.MIG_SELECTOR
    assert all(e.claim.metadata.uid for e in events)  # derived by the submit path, as for any file
    assert not any(pipeline.is_mig(i, 0) for i in range(30))


@pytest.mark.parametrize(("gpu_claims", "mig_claims"), [(1, 0), (1000, 111), (9001, 1000)])
def test_the_fleet_holds_every_claim_with_room_to_spare(gpu_claims, mig_claims):
    nodes, mig_nodes = pipeline.fleet_for(gpu_claims, mig_claims)
    assert nodes * pipeline.GPUS_PER_NODE >= gpu_claims * 1.1
    assert mig_nodes * pipeline.MIG_SLICES_PER_NODE >= mig_claims * 1.1
    assert (mig_nodes == 0) == (mig_claims == 0)


def test_window_rate_counts_only_inside_the_window():
    times = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 9.0]
    assert pipeline.window_rate(times, 1.0, 3.0) == 2.0  # 1.0, 1.5, 2.0, 2.5 in [1, 3)
    assert pipeline.window_rate(times, 3.0, 3.0) is None


async def test_the_submitter_writes_every_file_before_the_clock_runs(tmp_path):
    # the harness's writes are not the user's submit path: none is left to the measured window
    class Recording(pipeline.Submitter):
        async def submit(self, paths: list[str]) -> None:
            batches.append((paths, sorted(p.name for p in tmp_path.iterdir())))

    batches: list[tuple[list[str], list[str]]] = []
    names = [f"c-{i}" for i in range(40)]
    start, end = await Recording(None, tmp_path).offer(names, 2000.0, 10)  # type: ignore[arg-type]
    assert [p for paths, _ in batches for p in paths] == [str(tmp_path / f"{name}.json") for name in names]
    assert len(batches) > 1 and all(present == sorted(f"{name}.json" for name in names) for _, present in batches)
    assert end >= start


def test_backlog_and_latency_join_offers_to_records():
    offered = {"a": 10.0, "b": 11.0, "c": 12.0, "d": 13.0}
    records = {"a": Record("a", "allocated", 10.25), "b": Record("b", "allocated", 12.5), "c": Record("c", "unsatisfiable", 14.0)}
    assert pipeline.backlog_at(offered, records, offered, 12.0) == 2  # b (stored at 12.5) and c (offered at 12.0)
    assert pipeline.backlog_at(offered, records, offered, 20.0) == 1  # d never stored
    # d has no record: counted until the records were read (at 20.0), not left out of the percentiles
    assert sorted(pipeline.latencies_ms(offered, records, ["a", "b", "d"], until=20.0)) == [250.0, 1500.0, 7000.0]


def test_cpu_per_claim_divides_each_process_by_the_claims_it_finished():
    submitted = {"a": 1.0, "b": 1.5, "c": 2.0, "d": 2.5, "e": 9.0}  # the submitter runs ahead
    committed = {"a": 1.2, "b": 2.2, "c": 5.0}
    records = {"a": Record("a", "allocated", 1.3), "b": Record("b", "allocated", 2.3), "c": Record("c", "allocated", 5.1)}
    handled = pipeline.handled_times(submitted, committed, records, submitted)
    assert handled["bench"] == [1.0, 1.5, 2.0, 2.5, 9.0] and handled["allocator"] == [1.2, 2.2, 5.0]
    cpu = (1.0, 3.0, {"bench": 0.004, "allocator-0": 0.006, "statuswriter": 0.002, "nats-server-0": 0.001})
    per_claim = pipeline.cpu_ms_per_claim(cpu, handled)
    # in [1, 3): 4 claims into CLAIMS, 2 commits, 2 records
    assert per_claim == {"bench": 1.0, "allocator-0": 3.0, "statuswriter": 1.0, "nats-server-0": 0.5}
    assert pipeline.cpu_ms_per_claim((3.0, 4.0, {"allocator-0": 0.5}), handled) == {"allocator-0": None}  # nothing finished
    assert pipeline.cpu_ms_per_claim(None, handled) == {}


def test_stage_latencies_split_each_claim_at_its_stored_events():
    submitted = pipeline.claim_event("a")
    committed = ev.AllocationCommitted(claim=submitted.claim)  # (the join reads names and times only)
    other = ev.AllocationCommitted(claim=pipeline.claim_event("b").claim)
    claims = pipeline.first_stored([Stored(1, 10.004, submitted.subject, submitted, {}), Stored(2, 11.0, submitted.subject, submitted, {})], ev.ClaimSubmitted)
    decisions = pipeline.first_stored([Stored(1, 10.010, committed.subject, committed, {}), Stored(2, 10.5, other.subject, other, {})], ev.AllocationCommitted)
    assert claims == {"a": 10.004} and decisions == {"a": 10.010, "b": 10.5}  # the first of each, by name
    stages = pipeline.stage_latencies_ms({"a": 10.0}, claims, decisions, {"a": Record("a", "allocated", 10.013)}, ["a", "b"])
    assert stages == {"submit": [pytest.approx(4.0)], "allocate": [pytest.approx(6.0)], "status": [pytest.approx(3.0)]}


def test_the_sustained_window_leaves_out_warm_up_and_drain():
    submitted = {"a": 100.0, "b": 101.0, "c": 108.0}
    records = {"a": Record("a", "allocated", 100.0), "b": Record("b", "allocated", 104.0), "c": Record("c", "allocated", 120.0)}
    assert pipeline.sustained_window(submitted, records, ["a", "b", "c"]) == (102.0, 108.0)  # first record + a quarter, last submit
    assert pipeline.sustained_window(submitted, {}, ["a"]) is None


def test_cpu_between_takes_the_samples_inside_the_window():
    samples = [(1.0, {"x": 0.0}), (2.0, {"x": 0.5}), (3.0, {"x": 1.25}), (4.0, {"x": 3.0})]
    assert pipeline.cpu_between(samples, 1.5, 3.5) == (2.0, 3.0, {"x": 0.75})
    assert pipeline.cpu_between(samples, 1.5, 2.5) is None  # one sample: no span


def test_leader_terms_counts_the_epochs_that_wrote_decisions():
    claim = pipeline.claim_event("a").claim
    decision = ev.AllocationCommitted(claim=claim)
    stored = [Stored(i, 1.0, decision.subject, decision, {"Dralloc-Epoch": epoch}) for i, epoch in enumerate(["3", "3", "4"])]
    assert pipeline.leader_terms(stored) == 2
    assert pipeline.leader_terms(stored[:2]) == 1


def test_the_chain_rate_runs_from_the_first_publish_to_the_last_put():
    # the source publishes 100 in the first second; the puts come at 10 a second, the last at 15 s
    published = [i / 100 for i in range(100)]
    puts = [5.1 + i / 10 for i in range(100)]
    assert ceiling.chain_rate(published, puts) == pytest.approx(100 / 15.0)
    assert ceiling.chain_rate(published, []) is None
    assert ceiling.chain_rate([2.0], [1.0]) is None


async def test_the_ceiling_relays_every_message_through_two_consumer_processes(bus: Bus):
    await bus.key_value(DEFAULT_BUCKET)  # the status writer's bucket, whose configuration the ceiling copies
    payload = ev.encode(pipeline.claim_event("payload"))
    result = await ceiling.measure(bus, payload, 300, DEFAULT_BUCKET)
    assert result["messages"] == 300 and result["stored"] == 300
    assert result["claims_per_second"] is not None and result["claims_per_second"] > 0
    assert result["cpu_s"]["relay"] is not None and result["cpu_s"]["sink"] is not None  # both stages ran to the end
    by_stage = result["cpu_ms_per_claim_by_stage"]
    assert set(by_stage) == {"source", "relay", "sink"}
    assert by_stage["relay"] == pytest.approx(result["cpu_s"]["relay"] * 1000 / 300, abs=0.001)
    assert sum(by_stage.values()) == pytest.approx(result["cpu_ms_per_claim"], abs=0.01)
    names = [info.config.name async for info in _streams(bus)]
    assert not {"CEIL_IN", "CEIL_OUT", "KV_ceil"} & set(names)  # removed afterwards


async def _streams(bus: Bus):
    for info in await jetstream(bus).streams_info():
        yield info


def test_bench_pipeline_small_run_through_the_cli():
    result = CliRunner().invoke(
        app, ["bench", "pipeline", "--rate", "20", "--duration", "1", "--sustain-rate", "40", "--sustain", "1", "--ceiling", "200", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["outcomes"] == {"allocated": 60}  # 20 + 40 claims, each with its record in the status store
    assert report["mig_claims"] == 6 and report["mig_nodes"] >= 1
    assert report["submit_problems"] == 0
    assert report["leader_terms"] == 1 and report["not_allocated"] == []
    assert 0 < report["ready_s"] < 120  # (the stack's start to idle: a small fleet, a few seconds)
    assert report["p50_ms"] is not None and report["p99_ms"] >= report["p50_ms"]
    assert report["latency_claims_without_record"] == 0
    assert "cpu_ms_per_claim_by_process" in report  # (a 1 s phase may hold one CPU sample: tested on its own above)
    assert set(report["p99_ms_by_stage"]) == {"submit", "allocate", "status"}
    assert len(report["allocate_p50_ms_by_second"]) == 1 and report["allocate_p50_ms_by_second"][0] > 0  # 20 claims in 1 s
    assert report["claims_per_second"] is not None and report["ceiling"]["stored"] == 200
    assert report["ratio_of_ceiling"] == pytest.approx(report["claims_per_second"] / report["jetstream_ceiling_claims_per_second"], abs=0.001)


def test_bench_pipeline_refuses_nonsense():
    result = CliRunner().invoke(app, ["bench", "pipeline", "--sustain", "0"])
    assert result.exit_code == 2 and "--sustain" in result.stderr
    result = CliRunner().invoke(app, ["bench", "pipeline", "--mig-every", "-1"])
    assert result.exit_code == 2 and "--mig-every" in result.stderr


def test_runqueue_seconds_sums_each_threads_wait_and_skips_what_does_not_parse():
    # schedstat: on-CPU ns, runqueue-wait ns, timeslices; the wait is the second field.
    assert pipeline.runqueue_seconds(["900 1500000000 3\n", "7 250000000 1\n"]) == 1.75
    assert pipeline.runqueue_seconds(["", "garbage", "1 -5 2", "1 2.5 3"]) == 0.0


def test_process_runqueue_seconds_reads_this_process_and_is_zero_for_none_or_a_gone_pid():
    before = pipeline.process_runqueue_seconds(os.getpid())
    assert before >= 0.0
    assert pipeline.process_runqueue_seconds(os.getpid()) >= before  # a running total
    assert pipeline.process_runqueue_seconds(None) == 0.0
    assert pipeline.process_runqueue_seconds(2**22 + 1) == 0.0  # above Linux's pid_max: no such process


def test_sample_cpu_records_the_runqueue_wait_of_each_process_and_of_the_bench():
    async def once() -> tuple[list[pipeline.CpuSample], list[pipeline.CpuSample]]:
        samples: list[pipeline.CpuSample] = []
        waits: list[pipeline.CpuSample] = []
        stop = asyncio.Event()
        stop.set()  # one sample, then return
        await pipeline.sample_cpu({"me": os.getpid(), "gone": None}, stop, samples, waits=waits)
        return samples, waits

    samples, waits = asyncio.run(once())
    assert len(samples) == len(waits) == 1
    assert samples[0][0] == waits[0][0]  # taken together: the same window applies to both
    assert set(waits[0][1]) == {"me", "gone", "bench"}
    assert waits[0][1]["gone"] == 0.0


def test_main_thread_seconds_is_this_threads_share_and_zero_for_none_or_a_gone_pid():
    import threading

    def spin() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    before_main, before_all = pipeline.main_thread_seconds(os.getpid()), pipeline.process_cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    main, everything = pipeline.main_thread_seconds(os.getpid()) - before_main, pipeline.process_cpu_seconds(os.getpid()) - before_all
    assert everything >= 0.25 and main < 0.2  # the other thread's spin is the process's, not the main thread's
    assert pipeline.main_thread_seconds(None) == 0.0
    assert pipeline.main_thread_seconds(2**22 + 1) == 0.0


async def test_the_status_writer_bench_stores_every_record_and_reports_its_cpu_per_record():
    import statuswriter as bench  # benchmarks/statuswriter.py (on the path above); a round raises unless every record is stored

    report = await bench.run(records=40, rounds=2, timeout=60)
    assert report["records"] == 40 and len(report["rounds"]) == 2
    for round_ in report["rounds"]:
        assert round_["writer_us_per_record"] > 0 and round_["nats_server_us_per_record"] >= 0
    commit = bench.commit(19)
    assert commit.key == "bench/sustain-19" and commit.allocation is not None and commit.claim.spec.devices.requests[0].name == "mig"


def test_the_allocate_stage_by_second_of_the_phase_shows_where_claims_waited():
    offered = {"a": 10.0, "b": 10.5, "e": 10.9, "c": 11.2, "d": 13.9}
    submitted = {"a": 10.01, "b": 10.51, "e": 10.91, "c": 11.21, "d": 13.91}
    committed = {"a": 10.61, "b": 10.71, "e": 11.31, "c": 11.22}  # d: no decision
    assert pipeline.p50_ms_by_second(offered, submitted, committed, ["a", "b", "e", "c", "d", "never"]) == [
        pytest.approx(400.0),  # a (600 ms), e (400 ms), b (200 ms): a stall at the start
        pytest.approx(10.0),
        None,  # nothing offered in that second
        None,  # d was offered, but has no decision
    ]
    assert pipeline.p50_ms_by_second({}, {}, {}, ["a"]) == []
