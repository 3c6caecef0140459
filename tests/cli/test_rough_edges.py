"""The rough edges of issue #14, each against real parts: a real nats-server, the services in-process,
the CLI as a user runs it (a subprocess, or a pseudo-terminal for Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_terminal import ctrl_c_once_shown
from typer.testing import CliRunner

from dralloc.cli import app
from dralloc.demo import running

DRALLOC = str(Path(sys.executable).parent / "dralloc")
CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"


def dralloc(*args: str, url: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([DRALLOC, *args], env={**os.environ, "NATS_URL": url}, capture_output=True, text=True, timeout=timeout)


def claim(name: str, count: int, class_name: str = "gpu.nvidia.com") -> str:
    return f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec: {{devices: {{requests: [{{name: gpus, exactly: {{deviceClassName: {class_name}, count: {count}}}}}]}}}}
"""


async def test_get_deadletters_on_an_empty_stream(bus, nats_url):
    assert await bus.dead_letters() == []
    table = await asyncio.to_thread(dralloc, "get", "deadletters", url=nats_url)
    assert table.returncode == 0, table.stderr
    assert "0 dead letters" in table.stdout and "Traceback" not in table.stderr
    as_json = await asyncio.to_thread(dralloc, "get", "deadletters", "-o", "json", url=nats_url)
    assert json.loads(as_json.stdout) == {"deadLetters": []}


async def test_submit_wait_returns_once_every_claim_is_decided_for_good(nats_url, tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(CLASSES.read_text() + claim("two", 2) + claim("too-many", 64))
    async with running(nats_url, paths=[], fleet=[("l40s-pcie", 1)]):
        # --wait is an hour: the command returns because both claims are settled (one allocated,
        # one an error), not because the time ran out (the subprocess would time out first)
        out = await asyncio.to_thread(dralloc, "submit", "-f", str(path), "--wait", "3600", "-o", "json", url=nats_url)
    assert out.returncode == 1, out.stderr
    states = {c["claim"]: c["state"] for c in json.loads(out.stdout)["claims"]}
    assert states == {"ml/two": "allocated", "ml/too-many": "error"}
    assert "still unsatisfiable" not in out.stderr


async def test_submit_wait_names_the_claims_still_unsatisfiable(nats_url, tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(CLASSES.read_text() + claim("nine", 9) + claim("one", 1))
    async with running(nats_url, paths=[], fleet=[("l40s-pcie", 1)]):
        # Long enough for the fleet and both decisions on a loaded machine (3 s once was not).
        out = await asyncio.to_thread(dralloc, "submit", "-f", str(path), "--wait", "8", url=nats_url)
    assert out.returncode == 1
    assert "dralloc: after 8s, still unsatisfiable: ml/nine" in out.stderr
    assert "ml/one" in out.stdout and "allocated" in out.stdout


async def test_submit_wait_keeps_waiting_for_a_claim_whose_class_comes_after_it(nats_url, tmp_path):
    # The claim is decided first as an error (no such class); the class comes later and the
    # allocator decides the claim again: --wait must not have taken the first error as final.
    path = tmp_path / "claim.yaml"
    path.write_text(claim("late-class", 1))
    async with running(nats_url, paths=[], fleet=[("l40s-pcie", 1)]):
        waiting = asyncio.create_task(asyncio.to_thread(dralloc, "submit", "-f", str(path), "--wait", "60", "-o", "json", url=nats_url))
        first = await asyncio.to_thread(dralloc, "get", "claims", "-o", "json", url=nats_url)
        while "late-class" not in first.stdout and not waiting.done():
            await asyncio.sleep(0.2)
            first = await asyncio.to_thread(dralloc, "get", "claims", "-o", "json", url=nats_url)
        classes = await asyncio.to_thread(dralloc, "submit", "-f", str(CLASSES), url=nats_url)
        out = await waiting
    assert classes.returncode == 0, classes.stderr
    assert "not found" in first.stdout  # it was an error first: the case this test is about
    assert out.returncode == 0, out.stdout + out.stderr
    assert [c["state"] for c in json.loads(out.stdout)["claims"]] == ["allocated"]


def test_an_error_naming_a_missing_class_is_not_final_for_wait():
    from dralloc.client.submit import settled, unsettled_summary
    from dralloc.schemas.status import ClaimStatus

    missing = ClaimStatus(claim="ml/a", uid="u", state="error", message="claim ml/a, request gpus: device class 'gpu.nvidia.com' not found")
    invalid = ClaimStatus(claim="ml/b", uid="u", state="error", message="claim ml/b, request gpus: count 64 exceeds the limit")
    assert not settled(missing) and settled(invalid)
    assert unsettled_summary([missing, invalid], 5) == "after 5s, device class still not found: ml/a"


async def test_gang_domain_flag_and_the_refusal_that_says_how(nats_url, tmp_path):
    path = tmp_path / "gang.yaml"
    path.write_text(claim("worker-0", 8) + claim("worker-1", 8))
    async with running(nats_url, paths=[], fleet=[("l40s-pcie", 2)]):
        refused = await asyncio.to_thread(dralloc, "submit", "-f", str(CLASSES), "-f", str(path), "--gang", "job", "--wait", "5", "-o", "json", url=nats_url)
        messages = [c["message"] for c in json.loads(refused.stdout)["claims"]]
        assert refused.returncode == 1
        assert all('to allow any nodes, annotate the claims with dralloc.dev/gang-domain: "" (dralloc submit --gang-domain "")' in m for m in messages), (
            messages
        )
        await asyncio.to_thread(dralloc, "delete", "-f", str(path), url=nats_url)
        path.write_text(claim("worker-2", 8) + claim("worker-3", 8))
        anywhere = await asyncio.to_thread(
            dralloc, "submit", "-f", str(path), "--gang", "job2", "--gang-domain", "", "--wait", "60", "-o", "json", url=nats_url
        )
    assert anywhere.returncode == 0, anywhere.stdout + anywhere.stderr
    nodes = {c["node"] for c in json.loads(anywhere.stdout)["claims"]}
    assert nodes == {"l40s-pcie-0", "l40s-pcie-1"}


def test_gang_domain_needs_a_gang():
    result = CliRunner().invoke(app, ["submit", "-f", str(CLASSES), "--gang-domain", ""])
    assert result.exit_code == 2 and "--gang-domain needs --gang NAME" in result.stderr


def test_version():
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"dralloc {version('dralloc')}\n"


@pytest.mark.parametrize("command", [[], ["allocate"], ["explain"], ["submit"], ["get", "claims"], ["lint"], ["demo"], ["bench", "engine"]])
def test_help_has_no_type_labels_and_no_ragged_lines(command):
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=80)
    assert result.exit_code == 0
    text = result.stdout
    for label in ("<bool>", "<str>", "<list[str]>", "<float>", "<int>", "│", "╭"):
        assert label not in text, (label, text)
    assert all(len(line) <= 80 for line in text.splitlines())
    options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
    assert options and all(line.startswith("  -") for line in options)


def test_ctrl_c_on_the_demo_is_quiet():
    """A terminal's Ctrl-C (SIGINT to the whole foreground group) stops the demo without NATS noise."""
    code, stderr = ctrl_c_once_shown([DRALLOC, "demo"], b"allocated")
    assert code == 0
    assert stderr == b""


def test_long_expressions_are_cut_in_messages(tmp_path):
    """A 10 KB selector that fails is named by its start and length, never repeated whole."""
    long_or = " || ".join(f"device.attributes['gpu.nvidia.com'].productName == 'model-{i}'" for i in range(150))
    expression = f"({long_or}) && ("  # a syntax error at the very end
    assert len(expression) > 9000
    path = tmp_path / "claim.yaml"
    path.write_text(
        CLASSES.read_text()
        + f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: long, namespace: ml}}
spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, selectors: [{{cel: {{expression: {json.dumps(expression)}}}}}]}}}}]}}}}
"""
    )
    allocated = CliRunner().invoke(app, ["allocate", "-f", str(path), "--profile", "l40s-pcie", "-o", "json"])
    (entry,) = json.loads(allocated.stdout)["results"]
    assert entry["status"] == "error"
    assert len(entry["message"]) < 1500 and f"({len(expression)} characters)" in entry["message"]
    linted = CliRunner().invoke(app, ["lint", "-f", str(path)])
    assert all(len(line) < 1500 for line in linted.stdout.splitlines())
    explained = CliRunner().invoke(app, ["explain", "-f", str(path), "--profile", "l40s-pcie", "-o", "table"], terminal_width=200)
    assert all(len(line) < 1500 for line in explained.stdout.splitlines())


async def test_piped_submit_tables_keep_full_names(nats_url, tmp_path):
    long = "a-claim-name-long-enough-that-an-eighty-column-table-would-have-to-cut-it"
    path = tmp_path / "claims.yaml"
    path.write_text(CLASSES.read_text() + claim(long, 1))
    async with running(nats_url, paths=[], fleet=[("l40s-pcie", 1)]):
        out = await asyncio.to_thread(dralloc, "submit", "-f", str(path), "--wait", "60", url=nats_url)
    assert out.returncode == 0, out.stderr
    assert f"ml/{long}" in out.stdout


def test_a_misspelt_field_stops_allocate_and_lint_naming_it(tmp_path):
    """`selector:` for `selectors:` would have allocated any GPU of the class (CLI-CONTRACT: a
    document that cannot be decoded is exit 2, one message naming file, document and field)."""
    path = tmp_path / "claim.yaml"
    path.write_text(
        CLASSES.read_text()
        + """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: typo, namespace: ml}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, selector: [{cel: {expression: "false"}}]}}]}}
"""
    )
    allocated = CliRunner().invoke(app, ["allocate", "-f", str(path), "--profile", "l40s-pcie", "-o", "json"])
    assert allocated.exit_code == 2 and allocated.stdout == ""
    assert 'ResourceClaim/typo: unknown field "spec.devices.requests[0].exactly.selector"' in allocated.stderr
    linted = CliRunner().invoke(app, ["lint", "-f", str(path)])
    assert linted.exit_code == 1 and 'unknown field "spec.devices.requests[0].exactly.selector"' in linted.stdout
    fixed = path.read_text().replace("selector:", "selectors:")
    path.write_text(fixed)
    allocated = CliRunner().invoke(app, ["allocate", "-f", str(path), "--profile", "l40s-pcie", "-o", "json"])
    assert allocated.exit_code == 1 and json.loads(allocated.stdout)["results"][0]["status"] == "unsatisfiable"
