"""`dralloc demo` as a user runs it: a subprocess, without and with a terminal."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from dralloc import demo

DRALLOC = str(Path(sys.executable).parent / "dralloc")


def private_tmp(tmp_path: Path) -> dict[str, str]:
    """An environment whose TMPDIR is the test's own, so other runs on the machine cannot interfere."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def leftovers(env: dict[str, str]) -> tuple[list[Path], list[str]]:
    """Temp dirs the demo left in its TMPDIR, and nats-server processes still running from there."""
    tmp = env["TMPDIR"]
    dirs = sorted(Path(tmp).glob("dralloc-nats-*"))
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "nats-server" in cmdline and tmp in cmdline:
            procs.append(pid)
    return dirs, procs


def test_demo_without_a_terminal_lists_every_example_claim_and_leaves_nothing_behind(tmp_path: Path):
    env = private_tmp(tmp_path)
    out = subprocess.run([DRALLOC, "demo"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    expected = demo.expected_claims([str(demo.EXAMPLES)])
    assert len(expected) >= 6
    lines = out.stdout.splitlines()
    for claim in expected:
        (row,) = [line for line in lines if f" {claim} " in line]
        assert " allocated " in row or " unsatisfiable " in row or " error " in row, row
    assert sum(" allocated " in line for line in lines) >= 6
    assert leftovers(env) == ([], [])


def test_demo_on_a_terminal_runs_until_ctrl_c_then_cleans_up(tmp_path: Path):
    (tmp_path / "claim.yaml").write_text((demo.EXAMPLES / "deviceclasses.yaml").read_text() + "---\n" + (demo.EXAMPLES / "l40s-inference.yaml").read_text())
    env = private_tmp(tmp_path)
    main, child = pty.openpty()
    proc = subprocess.Popen([DRALLOC, "demo", "-f", str(tmp_path / "claim.yaml")], stdin=child, stdout=child, stderr=child, close_fds=True, env=env)
    os.close(child)
    screen = b""
    try:
        deadline = time.monotonic() + 60
        while b"allocated" not in screen and time.monotonic() < deadline:
            if select.select([main], [], [], 0.2)[0]:
                screen += os.read(main, 65536)
        assert b"allocated" in screen and b"inference/l40s-inference" in screen
        time.sleep(0.5)
        assert proc.poll() is None  # still running, live
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([main], [], [], 0.2)[0]:
                try:
                    screen += os.read(main, 65536)
                except OSError:
                    break
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    assert b"Traceback" not in screen
    assert leftovers(env) == ([], [])


def test_demo_interrupted_while_starting_still_cleans_up(tmp_path: Path):
    env = private_tmp(tmp_path)
    proc = subprocess.Popen([DRALLOC, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while not leftovers(env)[0] and time.monotonic() < deadline:  # its server is starting
            time.sleep(0.02)
        assert leftovers(env)[0], "the demo never started its server"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"Traceback" not in proc.stderr.read()
    assert leftovers(env) == ([], [])
