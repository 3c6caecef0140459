"""compose.yaml parses and refers only to services, files and settings that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DRALLOC_SERVICES = {"allocator", "discovery", "ingestor", "statuswriter"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose.yaml").read_text())  # merge keys (<<) resolved by PyYAML


def test_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == DRALLOC_SERVICES | {"nats", "otel-collector", "jaeger"}
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")  # Jaeger v2
    nats = services["nats"]
    assert "--jetstream" in nats["command"] and "healthcheck" in nats
    assert "js-enabled-only=true" in " ".join(nats["healthcheck"]["test"])  # healthy means JetStream is up


def test_references_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    declared_volumes = set(compose.get("volumes", {}))
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        if "build" in service:
            context = REPO / (service["build"] if isinstance(service["build"], str) else service["build"]["context"])
            assert (context / "Dockerfile").is_file(), f"{name}: no Dockerfile in {context}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in declared_volumes, f"{name} uses undeclared volume {source}"
        for key, value in service.get("environment", {}).items():
            if key in ("NATS_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"):
                assert urlparse(value).hostname in services, f"{name}: {key} points at no service"


def test_dralloc_services_share_one_image_and_run_their_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in DRALLOC_SERVICES:
        service = services[name]
        assert service["build"] == "." and service["image"] == "dralloc:dev"
        assert service["command"] == ["run", name]
        assert service["depends_on"]["nats"]["condition"] == "service_healthy"
        assert service["environment"]["OTEL_SERVICE_NAME"] == f"dralloc-{name}"


def test_collector_config_is_wired(compose: dict[str, Any]) -> None:
    collector = compose["services"]["otel-collector"]
    mount = next(v for v in collector["volumes"] if v.startswith("./infra/"))
    source, target = mount.split(":")[:2]
    assert f"--config={target}" in collector["command"]
    config = yaml.safe_load((REPO / source).read_text())
    for pipeline in config["service"]["pipelines"].values():
        for receiver in pipeline["receivers"]:
            assert receiver in config["receivers"]
        for exporter in pipeline["exporters"]:
            assert exporter in config["exporters"]
    jaeger = config["exporters"]["otlp/jaeger"]["endpoint"].split(":")[0]
    assert jaeger in compose["services"]


def test_dockerfile_copies_what_exists() -> None:
    text = (REPO / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (?!--from)(.+?) \S+$", text, flags=re.MULTILINE)
    sources = [s for line in copies for s in line.split()]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), f"Dockerfile copies {source}, which does not exist"
    assert 'ENTRYPOINT ["dralloc"]' in text


def test_the_image_ships_the_native_engine() -> None:
    """A static reading of the Dockerfile (no Docker daemon runs here; README "Native build" says how
    its stages' commands were run by hand): the wheel is built with the native engine, where the
    dependencies mypyc checks against are installed, on the CPython the runtime stage runs, and the
    image build checks that the engine came out compiled."""
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, flags=re.MULTILINE)
    assert [name for _, name in stages] == ["build", ""], stages
    (build, _), (runtime, _) = stages
    assert build.startswith("python:") and not build.endswith("-slim"), "the build stage needs a C compiler"
    assert runtime == f"{build}-slim", "an extension is built for one CPython: the runtime stage must run the build stage's"
    build_text, runtime_text = text.split("\nFROM ", 2)[1:]
    steps = " ".join(" ".join(line for line in build_text.splitlines() if not line.startswith("#")).replace("\\", " ").split())
    wheel = steps.index("pip wheel")
    assert "DRALLOC_NATIVE=1 pip wheel" in steps and "--no-build-isolation" in steps[wheel:]
    assert "'.[otlp]'" in steps[: steps.index("DRALLOC_NATIVE=1")], "mypyc needs the dependencies installed before the build"
    assert "mypy" in steps[: steps.index("DRALLOC_NATIVE=1")]
    assert "compiled()" in runtime_text


def test_commands_and_settings_are_ones_dralloc_knows(compose: dict[str, Any]) -> None:
    from dralloc.cli import run_app

    commands = {c.name for c in run_app.registered_commands}
    code = "\n".join(p.read_text() for p in (REPO / "services").rglob("*.py"))
    for name in DRALLOC_SERVICES:
        service = compose["services"][name]
        assert service["command"][1] in commands, f"dralloc run has no {service['command'][1]!r}"
        for variable in service["environment"]:
            if variable.startswith("DRALLOC_") or variable == "NATS_URL":
                assert f'"{variable}"' in code, f"{name}: {variable} is read nowhere in services/"
