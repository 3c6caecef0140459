"""Fuzz tests: hostile input to the services; the message builders come from the pipeline benchmark."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
