"""NATS security against a real nats-server: per-service users from infra/nats/auth.conf, passwords, TLS."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from pipeline import NatsServer, Stack, claim_event, offer, settle

from dralloc.bus import Bus, BusError
from dralloc.schemas import events as ev

AUTH = Path(__file__).resolve().parents[2] / "infra" / "nats" / "auth.conf"
SERVICES = ("discovery", "ingestor", "allocator", "statuswriter", "admin")
PASSWORDS = {f"DRALLOC_{s.upper()}_NATS_PASSWORD": f"secret-{s}" for s in SERVICES}


def as_user(monkeypatch: pytest.MonkeyPatch, user: str, password: str | None = None) -> None:
    monkeypatch.setenv("NATS_USER", user)
    monkeypatch.setenv("NATS_PASSWORD", password or f"secret-{user}")


async def test_each_service_runs_as_its_own_user_and_may_only_publish_its_own_subjects(monkeypatch, tmp_path):
    (tmp_path / "auth.conf").write_text(AUTH.read_text())
    stack = Stack(
        nodes=2,
        root=tmp_path,
        nats_config="include ./auth.conf\n",
        nats_env=PASSWORDS,
        service_env={s: {"NATS_USER": s, "NATS_PASSWORD": f"secret-{s}"} for s in SERVICES},
    )
    as_user(monkeypatch, "admin")
    async with stack:
        async with await Bus.connect(stack.nats.url, name="admin") as admin:
            await stack.ready(admin)  # discovery, ingestor and allocator did their part under their users
            await offer(admin, ["a", "b"], 10, asyncio.Event())
            assert (await settle(admin, {"a", "b"}, 15)).lost == 0
            kv = await admin.key_value("dralloc-claims")
            async with asyncio.timeout(10):  # the status writer stored them under its user
                while len(await kv.keys()) < 3:
                    await asyncio.sleep(0.1)

        # Out of its lane, each user is refused by the server.
        probe = claim_event("sneaky")
        decision = ev.AllocationFailed(namespace="bench", name="x", uid="u", generation=1, reason="error", message="forged")
        for user, event in (("ingestor", decision), ("statuswriter", probe), ("discovery", probe), ("allocator", probe)):
            as_user(monkeypatch, user)
            async with await Bus.connect(stack.nats.url, name=user) as bus:
                with pytest.raises((TimeoutError, BusError)):  # a permissions violation: no ack ever comes
                    await asyncio.wait_for(bus.publish(event), 2)

        # The allocator's snapshot of live decisions (bucket dralloc-snapshot): only it may write it.
        for user in ("ingestor", "statuswriter", "discovery", "allocator"):
            as_user(monkeypatch, user)
            async with await Bus.connect(stack.nats.url, name=user) as bus:
                put = _put(bus, "$KV.dralloc-snapshot.head", b'{"format": 1}')
                if user == "allocator":
                    assert (await asyncio.wait_for(put, 5)).stream == "KV_dralloc-snapshot"
                else:
                    with pytest.raises((TimeoutError, BusError)):  # a permissions violation: no ack ever comes
                        await asyncio.wait_for(put, 2)

        as_user(monkeypatch, "ingestor", "wrong")
        with pytest.raises(BusError, match="(?i)authorization"):
            await Bus.connect(stack.nats.url, name="intruder", timeout=3)


async def _put(bus: Bus, subject: str, data: bytes):  # type: ignore[no-untyped-def]
    return await (await bus.send_bytes(subject, data))


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, made with openssl."""
    ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    run = lambda *args: subprocess.run(["openssl", *args], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=dralloc-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", directory / "san.ext")
    return ca, cert, key


async def test_tls_is_verified_against_the_given_ca(monkeypatch, tmp_path):
    ca, cert, key = _certificates(tmp_path)
    server = NatsServer(tmp_path, config=f'tls {{ cert_file: "{cert}", key_file: "{key}" }}\n', scheme="tls")
    await server.start()
    try:
        monkeypatch.setenv("NATS_TLS_CA", str(ca))
        async with await Bus.connect(server.url, name="tls") as bus:
            await bus.ensure_streams()
            assert not (await bus.publish(claim_event("over-tls"))).duplicate
        monkeypatch.delenv("NATS_TLS_CA")  # the system's CAs do not know this server
        with pytest.raises(BusError, match="(?i)certificate"):
            await Bus.connect(server.url, name="tls", timeout=3)
        monkeypatch.setenv("NATS_TLS_CA", str(tmp_path / "missing.pem"))
        with pytest.raises(BusError, match="NATS_TLS_CA=.*no such file"):
            await Bus.connect(server.url, name="tls", timeout=3)
    finally:
        await server.stop()
