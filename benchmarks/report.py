"""Run every benchmark the README's "Numbers" section quotes, one after another; one JSON line per command.

    python benchmarks/report.py > numbers.jsonl          # everything (~13 min on the project's 2 cores, idle)
    python benchmarks/report.py --only engine,takeover   # the benchmarks whose name starts so

Each line: {"command": the exact command, as the README prints it, "commit": the tree's commit
(`-dirty` with uncommitted edits), "python": the interpreter that ran it (its build moves every figure: README
"Which CPython"), "load": the 1-minute load average before and after it (above 1.5 the
README calls a figure loaded), "wall_s": how long it ran, "result": its JSON output} or, instead of
"result", "error": its last stderr lines. The README's "Numbers" section names the same commands, so a
figure there can be checked against a line here (tests/benchmarks/test_report.py keeps the two lists
equal). The commands run one at a time: two benchmarks at once measure each other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

COMMANDS: list[str] = [
    "dralloc bench engine --workload kube-perf-500 --json",
    "dralloc bench engine --workload kube-perf-500 --first-fit --json",
    "dralloc bench engine --workload churn-mixed --seed 7 --json",
    "dralloc bench engine --workload gpu-fleet-10k --seed 7 --json",
    "PYTHONPATH=build/native dralloc bench engine --workload kube-perf-500 --json",
    "PYTHONPATH=build/native dralloc bench engine --workload churn-mixed --seed 7 --json",
    "PYTHONPATH=build/native dralloc bench engine --workload gpu-fleet-10k --seed 7 --json",
    "dralloc bench scale --gpus 10k,50k,100k,250k --seed 7 --json",
    "PYTHONPATH=build/native dralloc bench scale --gpus 250k --seed 7 --json",
    "dralloc bench takeover --decisions 100000 --json",
    "dralloc bench takeover --decisions 1000000 --json",
    "dralloc bench takeover --decisions 100000 --no-snapshot --json",
    "dralloc bench placement --seeds 1-5 --loads 0.9,1.1 --max-wait 30 --moves --json",
    "dralloc bench placement --seeds 6-10 --loads 0.9,1.1 --max-wait 30 --moves --json",
    "dralloc bench placement --seeds 1-5 --loads 0.9,1.1 --max-wait 0 --json",
    "dralloc bench pipeline --json",
    "PYTHONPATH=build/native dralloc bench pipeline --json",
    "PYTHONPATH=build/native dralloc bench pipeline --sustain-rate 100 --sustain 1 --ceiling 0 --json",
    "python benchmarks/allocator.py --claims 10000 --rounds 3",
    "python benchmarks/statuswriter.py --records 10000 --rounds 2",
    "dralloc bench pipeline --chaos --rate 500 --duration 5 --burst 2000 --json",
    "dralloc bench pipeline --chaos --cluster 3 --rate 100 --duration 5 --burst 500 --json",
    "dralloc bench pipeline --hostile --json",
]
"""As the README prints them: `dralloc ...` runs the CLI, `python benchmarks/X.py ...` a script, each with this
interpreter; `PYTHONPATH=build/native` before one runs it on the native build (README "Native build": build it
first; the engine bench's `native` says which ran)."""


def split(command: str) -> tuple[dict[str, str], list[str]]:
    """The command's leading `NAME=value` environment, and its words after it."""
    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isupper():
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


def name(command: str) -> str:
    """What `--only` matches: the bench's name (`engine`, `pipeline`) or the script's (`allocator`)."""
    words = split(command)[1]
    return words[2] if words[0] == "dralloc" else Path(words[1]).stem


def argv(command: str) -> list[str]:
    """The command as this interpreter runs it: `dralloc` as `python -m dralloc.cli`, a script by its path."""
    words = split(command)[1]
    return [sys.executable, "-m", "dralloc.cli", *words[1:]] if words[0] == "dralloc" else [sys.executable, *words[1:]]


def commit() -> str | None:
    """The commit of the tree the benchmarks run in (the working directory), `-dirty` after it when tracked files
    differ from it; None outside a git checkout."""
    done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def interpreter() -> str:
    """The interpreter the commands run with: implementation, version and installation (a venv's base), e.g.
    "CPython 3.11.7 at /root/.pyenv/versions/3.11.7". Whether it was built with PGO and LTO is not said:
    `sysconfig` cannot tell (Debian drops its LTO flags from it), its installation can."""
    return f"{platform.python_implementation()} {platform.python_version()} at {sys.base_prefix}"


def run(command: str) -> dict:
    """Run one command in a fresh process; its JSON, or the error it ended with, and the load around it."""
    before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(argv(command), capture_output=True, text=True, check=False, env={**os.environ, **split(command)[0]})
    wall = round(time.perf_counter() - started, 1)
    line: dict = {"command": command, "commit": commit(), "python": interpreter(), "load": [round(before, 2), round(os.getloadavg()[0], 2)], "wall_s": wall}
    if done.returncode != 0:
        line["error"] = done.stderr.strip()[-1000:]
    else:
        line["result"] = json.loads(done.stdout)
    return line


def main(argv_: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated prefixes of the benchmarks to run (e.g. engine,takeover)")
    args = parser.parse_args(argv_)
    prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
    failed = 0
    for command in COMMANDS:
        if prefixes and not any(name(command).startswith(p) for p in prefixes):
            continue
        line = run(command)
        failed += "error" in line
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
