"""dralloc bench takeover: a real nats-server, live claims decided by a real allocator, released
history written as a leader writes it (its snapshot `--tail` decisions before the end); the
standby's rebuilt state is what the stream says, through the snapshot or without one."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dralloc.cli import app


@pytest.mark.parametrize(
    ("flags", "loaded_from", "tail"),
    [([], "snapshot", 99), (["--tail", "0"], "snapshot", 0), (["--no-snapshot"], "full", 300)],
)
def test_bench_takeover_rebuilds_the_live_claims_and_only_them(flags, loaded_from, tail, monkeypatch):
    monkeypatch.setenv("DRALLOC_ALLOCATOR_SNAPSHOT_EVERY", "100")  # the default tail: max(100, 40 live) - 1
    result = CliRunner().invoke(app, ["bench", "takeover", "--decisions", "300", "--live", "40", "--json", *flags])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["decisions"] == 300 and report["allocations_stream_messages"] == 300
    assert report["history_claims"] == 130  # (300 - 40) / 2 claims committed, then released
    assert report["loaded_from"] == loaded_from and report["tail_messages"] == tail
    if loaded_from == "snapshot":
        assert report["snapshot_seq"] == 300 - tail
    assert report["restored_live"] == 40 and report["restored_other"] == 0
    assert report["takeover_seconds"] > 0


def test_bench_takeover_refuses_nonsense():
    result = CliRunner().invoke(app, ["bench", "takeover", "--decisions", "0"])
    assert result.exit_code == 2 and "--decisions" in result.stderr
    result = CliRunner().invoke(app, ["bench", "takeover", "--tail", "-5"])
    assert result.exit_code == 2 and "--tail" in result.stderr
