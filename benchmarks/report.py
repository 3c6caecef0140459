"""Run every benchmark the README quotes, one after another; one JSON line per command.

    python benchmarks/report.py > numbers.jsonl          # everything (an idle machine: ~30 min)
    python benchmarks/report.py --only engine,takeover   # the commands whose name starts so

Each line: {"command": the exact `dralloc ...` command, "wall_s": how long it ran,
"result": its --json output} or {"command", "error": its last stderr lines}. The README's
"Numbers" section names the same commands, so a figure there can be checked against a line here.
The commands run one at a time: two benchmarks at once measure each other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

COMMANDS: list[list[str]] = [
    ["bench", "engine", "--workload", "kube-perf-500", "--json"],
    ["bench", "engine", "--workload", "kube-perf-500", "--first-fit", "--json"],
    ["bench", "engine", "--workload", "gpu-fleet-10k", "--seed", "7", "--json"],
    ["bench", "engine", "--workload", "churn-mixed", "--seed", "7", "--json"],
    ["bench", "engine", "--workload", "frontier-250k", "--seed", "7", "--json"],
    ["bench", "scale", "--gpus", "10k,50k,250k", "--seed", "7", "--json"],
    ["bench", "takeover", "--decisions", "100000", "--json"],
    ["bench", "takeover", "--decisions", "1000000", "--json"],
    ["bench", "placement", "--seeds", "1-5", "--loads", "0.9,1.1", "--json"],
    ["bench", "pipeline", "--json"],
]


def run(command: list[str]) -> dict:
    """Run `dralloc <command>` in a fresh process; its JSON, or the error it ended with."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dralloc.cli", *command], capture_output=True, text=True, check=False)
    line: dict = {"command": "dralloc " + " ".join(command), "wall_s": round(time.perf_counter() - started, 1)}
    if done.returncode != 0:
        line["error"] = done.stderr.strip()[-1000:]
    else:
        line["result"] = json.loads(done.stdout)
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated prefixes of the commands to run (e.g. engine,takeover)")
    args = parser.parse_args(argv)
    prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
    failed = 0
    for command in COMMANDS:
        if prefixes and not any(command[1].startswith(p) for p in prefixes):
            continue
        line = run(command)
        failed += "error" in line
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
