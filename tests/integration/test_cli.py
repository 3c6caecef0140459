"""The bus commands as users run them: `dralloc submit`, `dralloc run <service>`, `dralloc get claims`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream

DRALLOC = str(Path(sys.executable).parent / "dralloc")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GOOD = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: good, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""


def dralloc(*args: str, url: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "NATS_URL": url}
    return subprocess.run([DRALLOC, *args], env=env, capture_output=True, text=True, timeout=60, **kwargs)


async def test_submit_publishes_the_good_objects_and_names_each_bad_one(bus: Bus, nats_url: str, tmp_path: Path):
    (tmp_path / "a.yaml").write_text(GOOD + "---\nkind: [\n")
    (tmp_path / "b.yaml").write_text(GOOD.replace("good", "wrong").replace("deviceClassName: gpu.nvidia.com", "deviceClassName: 7"))
    huge = GOOD.replace("name: good,", "name: huge, annotations: {blob: '" + "x" * 2_000_000 + "'},")
    (tmp_path / "c.yaml").write_text(huge)
    out = await asyncio.to_thread(dralloc, "submit", "-f", str(tmp_path), "-o", "json", url=nats_url)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    problems = out.stderr.strip().splitlines()
    assert len(problems) == 3, out.stderr
    assert problems[0].startswith(f"dralloc: {tmp_path / 'a.yaml'} (document 2): invalid YAML")
    assert problems[1] == (
        f"dralloc: {tmp_path / 'b.yaml'} (document 1): ResourceClaim/wrong: field spec.devices.requests[0].exactly.deviceClassName: Expected `str`, got `int`"
    )
    assert problems[2].startswith("dralloc: ResourceClaim/ml/huge: not published: ClaimSubmitted on dra.claims.ml.huge is ")
    assert "over the server's message limit" in problems[2]
    published = json.loads(out.stdout)["published"]
    assert [(p["object"], p["duplicate"]) for p in published] == [("ResourceClaim/ml/good", False)]
    assert (await bus.stream_state("CLAIMS")).messages == 1

    again = await asyncio.to_thread(dralloc, "submit", "-f", str(tmp_path / "a.yaml"), url=nats_url)
    assert again.returncode == 2  # the YAML error is still there
    assert "ResourceClaim/ml/good" in again.stdout and "unchanged" in again.stdout
    assert (await bus.stream_state("CLAIMS")).messages == 1


async def test_each_service_runs_alone_as_its_own_process(bus: Bus, nats_url: str, tmp_path: Path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {profile: h100-sxm, count: 1}\n- {profile: l40s-pcie, count: 1}\n")
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        "DRALLOC_DISCOVERY_SOURCE": "fleet",
        "DRALLOC_DISCOVERY_FLEET": str(fleet),
        "DRALLOC_INGESTOR_PATHS": str(EXAMPLES),
    }
    procs = {
        name: subprocess.Popen([DRALLOC, "run", name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("discovery", "allocator", "statuswriter", "ingestor")
    }
    try:
        wanted = {"team-a/single-gpu-40gi", "inference/l40s-inference", "team-b/hopper-nvlink-quad"}
        allocated: set[str] = set()
        async with asyncio.timeout(60):
            while not wanted <= allocated:
                await asyncio.sleep(0.3)
                out = await asyncio.to_thread(dralloc, "get", "claims", "-o", "json", url=nats_url)
                claims = json.loads(out.stdout)["claims"] if out.returncode == 0 else []
                allocated = {c["claim"] for c in claims if c["state"] == "allocated"}
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(timeout=30) for name, proc in procs.items()}
        logs = {name: proc.stderr.read() for name, proc in procs.items()}
    assert codes == dict.fromkeys(procs, 0), logs
    assert not any("Traceback" in log for log in logs.values()), logs


def test_run_with_a_bad_setting_says_which_in_one_line(tmp_path: Path):
    env = {**os.environ, "DRALLOC_STATUSWRITER_SINK": "floppy", "NATS_URL": "nats://127.0.0.1:9"}
    out = subprocess.run([DRALLOC, "run", "statuswriter"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "dralloc: unknown sink 'floppy': use local or kubernetes"


async def test_submit_wait_shows_each_claims_decision(bus: Bus, nats_url: str, tmp_path: Path):
    from dralloc import demo

    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    (tmp_path / "fits.yaml").write_text(GOOD)
    (tmp_path / "too-big.yaml").write_text(
        GOOD.replace("good", "too-big").replace("deviceClassName: gpu.nvidia.com", "deviceClassName: gpu.nvidia.com, count: 9")
    )
    async with demo.running(nats_url, paths=[str(tmp_path / "classes.yaml")], fleet=[{"profile": "h100-sxm", "count": 1}]):
        fits = await asyncio.to_thread(dralloc, "submit", "-f", str(tmp_path / "fits.yaml"), "--wait", "30", "-o", "json", url=nats_url)
        assert fits.returncode == 0, fits.stderr
        (claim,) = json.loads(fits.stdout)["claims"]
        assert (claim["claim"], claim["state"], claim["node"]) == ("ml/good", "allocated", "h100-sxm-0")
        assert len(claim["allocation"]["devices"]["results"]) == 1

        big = await asyncio.to_thread(dralloc, "submit", "-f", str(tmp_path / "too-big.yaml"), "--wait", "3", url=nats_url)
        assert big.returncode == 1
        assert big.stdout.split()[5:7] == ["ml/too-big", "unsatisfiable"]


async def test_delete_releases_the_claims_in_the_files(bus: Bus, nats_url: str, tmp_path: Path):
    from dralloc import demo

    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    (tmp_path / "claim.yaml").write_text(GOOD)
    async with demo.running(nats_url, paths=[str(tmp_path / "classes.yaml")], fleet=[{"profile": "h100-sxm", "count": 1}]):
        submitted = await asyncio.to_thread(dralloc, "submit", "-f", str(tmp_path / "claim.yaml"), "--wait", "30", url=nats_url)
        assert submitted.returncode == 0, submitted.stderr
        deleted = await asyncio.to_thread(dralloc, "delete", "-f", str(tmp_path / "claim.yaml"), "-o", "json", url=nats_url)
        assert deleted.returncode == 0, deleted.stderr
        assert [(p["event"], p["object"]) for p in json.loads(deleted.stdout)["published"]] == [("ClaimDeleted", "ResourceClaim/ml/good")]
        async with asyncio.timeout(15):
            while True:
                claims = json.loads((await asyncio.to_thread(dralloc, "get", "claims", "-o", "json", url=nats_url)).stdout)["claims"]
                if not claims:
                    break  # released: gone from the store
                await asyncio.sleep(0.2)
    last = await jetstream(bus).get_last_msg("ALLOCATIONS", "dra.allocations.ml.good")
    assert json.loads(last.data)["type"] == "AllocationReleased"


async def test_submitting_the_articles_manifest_shows_lints_diagnosis(bus: Bus, nats_url: str, shared_dir: Path):
    """The article's manifest gets the same diagnosis from `submit` as from `lint`, and the rest goes on."""
    seed = str(shared_dir / "examples" / "seed-manifest.yaml")
    out = await asyncio.to_thread(dralloc, "submit", "-f", seed, "-o", "json", url=nats_url)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    linted = subprocess.run([DRALLOC, "lint", "-f", seed, "-o", "json"], capture_output=True, text=True, timeout=60)
    (cel,) = [p for p in json.loads(linted.stdout)["problems"] if p["field"].endswith("cel.expression")]
    assert cel["message"] in out.stderr
    # lint's hints but those of the representative fleet (lint alone builds one)
    assert all(hint in out.stderr for hint in cel["hints"] if not hint.startswith(("(it selects", "no corrected expression")))
    assert "dralloc.dev'].nvlink == true" in out.stderr  # the suggestion uses the domain that publishes nvlink
    assert "h100-nvlink-template" in out.stderr  # the Pod's missing template is named too
    published = json.loads(out.stdout)["published"]
    assert [p["object"] for p in published] == ["DeviceClass/high-bandwidth-gpu"]


async def test_submit_gang_is_allocated_whole_inside_one_clique_or_not_at_all(bus: Bus, nats_url: str, tmp_path: Path):
    from dralloc import demo

    def job(name: str, workers: int) -> Path:
        claims = "---\n".join(
            GOOD.replace("name: good", f"name: {name}-{i}").replace("deviceClassName: gpu.nvidia.com", "deviceClassName: gpu.nvidia.com, count: 4")
            for i in range(workers)
        )
        path = tmp_path / f"{name}.yaml"
        path.write_text(claims)
        return path

    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    fleet = [{"profile": "gb200-nvl72", "count": 2}]  # two 4-GPU trays of one NVLink clique
    async with demo.running(nats_url, paths=[str(tmp_path / "classes.yaml")], fleet=fleet):
        # 3 x 4 GPUs cannot fit in 8: without the gang two claims would take both trays; as a gang, none holds any.
        big = await asyncio.to_thread(dralloc, "submit", "-f", str(job("big", 3)), "--gang", "big", "--wait", "3", "-o", "json", url=nats_url)
        assert big.returncode == 1
        assert [c["state"] for c in json.loads(big.stdout)["claims"]] == ["unsatisfiable"] * 3

        fits = await asyncio.to_thread(dralloc, "submit", "-f", str(job("fits", 2)), "--gang", "fits", "--wait", "30", "-o", "json", url=nats_url)
        assert fits.returncode == 0, fits.stderr
        claims = json.loads(fits.stdout)["claims"]
        assert sorted(c["claim"] for c in claims) == ["ml/fits-0", "ml/fits-1"]
        assert len({c["node"] for c in claims}) == 2  # one tray each, inside the one clique
