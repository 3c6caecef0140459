"""A command on a pseudo-terminal, interrupted as a user's Ctrl-C interrupts it."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence


def ctrl_c_once_shown(argv: Sequence[str], shown: bytes, *, env: Mapping[str, str] | None = None, timeout: float = 120) -> tuple[int, bytes]:
    """Run `argv` on a pseudo-terminal in its own session; once its screen holds `shown`, send SIGINT
    to the whole group (what a terminal's Ctrl-C does). Returns its exit code and what it wrote to
    stderr. Fails (AssertionError with the screen's end) if `shown` never appears within `timeout`."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=env, start_new_session=True)
    os.close(slave)
    seen = bytearray()
    appeared = threading.Event()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)
            if shown in seen:
                appeared.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert appeared.wait(timeout), bytes(seen[-2000:])
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        return proc.wait(60), stderr
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
