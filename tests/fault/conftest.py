"""Fault tests: real processes (nats-server, `dralloc run ...`) killed, stopped and restarted.

The process harness is the pipeline benchmark's (benchmarks/pipeline.py), so the
benchmark and these tests exercise the same stack.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
