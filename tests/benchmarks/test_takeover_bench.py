"""dralloc bench takeover: a real nats-server, live claims decided by a real allocator, released
history written as a leader writes it; the standby's rebuilt state is what the stream says."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dralloc.cli import app


def test_bench_takeover_rebuilds_the_live_claims_and_only_them():
    result = CliRunner().invoke(app, ["bench", "takeover", "--decisions", "300", "--live", "40", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["decisions"] == 300 and report["allocations_stream_messages"] == 300
    assert report["history_claims"] == 130  # (300 - 40) / 2 claims committed, then released
    assert report["restored_live"] == 40 and report["restored_other"] == 0
    assert report["takeover_seconds"] > 0


def test_bench_takeover_refuses_nonsense():
    result = CliRunner().invoke(app, ["bench", "takeover", "--decisions", "0"])
    assert result.exit_code == 2 and "--decisions" in result.stderr
