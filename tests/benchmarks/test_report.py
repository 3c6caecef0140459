"""`benchmarks/report.py` runs the commands the README's "Numbers" section prints (#17 item 3: every figure
from a command in the README): the two lists are kept equal here, so neither drifts without the other."""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402


def numbers_commands() -> set[str]:
    """Each concrete benchmark command in the Numbers section: a code span starting `dralloc bench` or
    `python benchmarks/` with options, whitespace (line wraps) collapsed; names without options (a heading's
    `dralloc bench engine`) and synopses with `[options]` or NAME are left out."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Numbers (benchmarks)\n", 1)[1].split("\n## ", 1)[0]
    section = re.sub(r"^```.*?^```", "", section, flags=re.MULTILINE | re.DOTALL)  # (a fence's backticks would pair with a span's)
    spans = {" ".join(span.split()) for span in re.findall(r"`([^`]+)`", section)}
    native = "PYTHONPATH=build/native "  # (the native build's runs: README "Native build")
    concrete = (s for s in spans if s.removeprefix(native).startswith(("dralloc bench ", "python benchmarks/")) and " --" in s)
    return {s for s in concrete if "[" not in s and not re.search(r"\b[A-Z]+\b", s.removeprefix(native))}


def test_the_report_runs_exactly_the_commands_the_numbers_section_prints():
    assert set(report.COMMANDS) == numbers_commands()


def test_only_picks_by_the_benchmarks_name_and_each_runs_with_this_interpreter():
    assert report.name("dralloc bench takeover --decisions 100000 --json") == "takeover"
    assert report.name("python benchmarks/statuswriter.py --records 10000 --rounds 2") == "statuswriter"
    assert report.argv("dralloc bench engine --workload kube-perf-500 --json")[:3] == [sys.executable, "-m", "dralloc.cli"]
    assert report.name("PYTHONPATH=build/native dralloc bench engine --workload kube-perf-500 --json") == "engine"
    assert report.split("PYTHONPATH=build/native dralloc bench engine --json") == ({"PYTHONPATH": "build/native"}, ["dralloc", "bench", "engine", "--json"])
    assert report.argv("python benchmarks/allocator.py --claims 10000 --rounds 3") == [
        sys.executable,
        "benchmarks/allocator.py",
        "--claims",
        "10000",
        "--rounds",
        "3",
    ]


def test_each_line_names_the_commit_and_the_load_around_the_command():
    line = report.run('python -c \'print("{\\"ok\\": 1}")\'')
    assert line["result"] == {"ok": 1}
    assert bool(line["commit"]) == (ROOT / ".git").exists()  # None outside a git checkout
    assert line["python"] == f"{platform.python_implementation()} {platform.python_version()} at {sys.base_prefix}"
    assert len(line["load"]) == 2 and all(load >= 0 for load in line["load"])
    failed = report.run("python -c 'import sys; sys.exit(\"no\")'")
    assert "result" not in failed and failed["error"] == "no"
