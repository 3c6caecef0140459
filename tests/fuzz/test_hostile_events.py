"""Random and mutated messages into every stream the services read: none crashes, each bad input gets a reason.

A seeded mutation fuzzer (the seed is in the test id, so a failure replays) builds
messages from valid events: bytes flipped or cut, fields dropped or given the
wrong type, huge strings and lists, deep nesting, unknown event types, wrong
schema versions, plus claims that decode but cannot be honoured (hostile CEL:
over the length limit, cost bombs of nested comprehensions; too many requests;
negative counts). They are published raw to CLAIMS (read by the allocator),
ALLOCATIONS (the status writer) and INVENTORY (the allocator). Then:

- every message the allocator read from CLAIMS has a dead letter naming a reason
  or an allocation outcome (AllocationFailed with a message for the invalid ones);
- every undecodable message in ALLOCATIONS and INVENTORY has a dead letter;
- the services are still alive: a valid claim submitted afterwards is committed.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest
from pipeline import CLASSES, claim_event

from dralloc import demo
from dralloc.bus import Bus, embedded_nats
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.statuswriter.sinks import read_all

ONE_NODE = [{"profile": "h100-sxm", "count": 1, "prefix": "h100"}]
NAMESPACE = "bench"  # pipeline.claim_event's


def valid_claim(name: str) -> dict[str, Any]:
    return json.loads(ev.encode(claim_event(name)))


def cel_bomb(depth: int) -> str:
    """Nested comprehensions over a list: the estimated cost grows as 100^depth."""
    items = "[" + ",".join(str(i) for i in range(100)) + "]"
    body = "true"
    for level in range(depth):
        body = f"{items}.all(x{level}, {body})"
    return body


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += _paths(value, (*prefix, i))
    return found


def _set(doc: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    if isinstance(doc, dict) and value is _DROP:
        doc.pop(path[-1], None)
    elif value is not _DROP:
        doc[path[-1]] = value


_DROP = object()
_ODD_VALUES = [None, -1, 0, 2**70, 1.5, "", "x" * 70_000, [], {}, [1] * 5000, True, "\x00\u202e", {"a": {"b": {"c": []}}}]


def mutated_claims(rng: random.Random, count: int) -> list[tuple[str, bytes, str]]:
    """(name, payload, kind): `raw` (does not decode: must be dead-lettered), `decodes` (a mutation that still
    decodes: any outcome or a dead letter) or `invalid` (decodes, cannot be honoured: refused with a reason)."""
    out: list[tuple[str, bytes, str]] = []
    for i in range(count):
        name = f"fuzz-{i}"
        doc = valid_claim(name)
        choice = rng.randrange(9)
        if choice == 0:
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        elif choice == 1:
            raw = json.dumps(doc).encode()
            payload = raw[: rng.randrange(1, len(raw))]  # cut short
        elif choice == 2:
            raw = bytearray(json.dumps(doc).encode())
            for _ in range(rng.randrange(1, 8)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            payload = bytes(raw)
        elif choice == 3:
            paths = [p for p in _paths(doc) if p]
            _set(doc, rng.choice(paths), rng.choice([_DROP, *_ODD_VALUES]))
            payload = json.dumps(doc).encode()
        elif choice == 4:
            doc[rng.choice(["type", "schemaVersion"])] = rng.choice(["Nope", 99, None, "ClaimSubmitted "])
            payload = json.dumps(doc).encode()
        elif choice == 5:
            depth = rng.choice([100, 5000])
            payload = b'{"type": "ClaimSubmitted", "claim": ' + b"[" * depth + b"]" * depth + b"}"
        else:  # decodes, but no allocator may honour it
            request = doc["claim"]["spec"]["devices"]["requests"][0]["exactly"]
            if choice == 6:
                request["selectors"] = [{"cel": {"expression": rng.choice([cel_bomb(3), cel_bomb(5), "true && " * 3000 + "true"])}}]
            elif choice == 7:
                request["count"] = rng.choice([-1, 0, 10**9])
            else:
                doc["claim"]["spec"]["devices"]["requests"] = [
                    {"name": f"r{j}", "exactly": {"deviceClassName": "gpu.nvidia.com"}} for j in range(rng.choice([33, 500]))
                ]
            out.append((name, json.dumps(doc).encode(), "invalid"))
            continue
        try:
            ev.decode(payload)
        except ev.EventDecodeError:
            out.append((name, payload, "raw"))
        else:
            out.append((name, payload, "decodes"))
    return out


async def dead_letters(bus: Bus) -> dict[tuple[str, int], str]:
    """(stream, sequence) -> reason, for every dead letter so far."""
    info = await jetstream(bus).stream_info("DEADLETTER")
    found = {}
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await jetstream(bus).get_msg("DEADLETTER", seq=seq)
        stream = msg.subject.split(".")[2]
        found[(stream, int(msg.headers["Dralloc-Sequence"]))] = msg.headers["Dralloc-Reason"]
    return found


async def outcomes(bus: Bus) -> dict[str, ev.Event]:
    info = await jetstream(bus).stream_info("ALLOCATIONS")
    found: dict[str, ev.Event] = {}
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            event = ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data)
        except ev.EventDecodeError:
            continue
        if isinstance(event, ev.AllocationCommitted | ev.AllocationFailed):
            found.setdefault(event.key, event)
    return found


@pytest.mark.parametrize("seed", [1, 2])
async def test_hostile_messages_are_dead_lettered_or_refused_with_a_reason_and_nothing_crashes(seed, tmp_path):
    rng = random.Random(seed)
    (tmp_path / "classes.yaml").write_text(CLASSES.read_text())
    async with embedded_nats() as url, await Bus.connect(url, name="fuzz") as bus:
        await bus.ensure_streams()
        async with demo.running(url, paths=[str(tmp_path)], fleet=ONE_NODE) as system:
            claims = mutated_claims(rng, 60)
            sequences: dict[str, int] = {}
            for name, payload, _ in claims:
                ack = await jetstream(bus).publish(f"dra.claims.{NAMESPACE}.{name}", payload)
                sequences[name] = ack.seq
            garbage = {}
            # INVENTORY first: a foreign write into ALLOCATIONS (next) fences the allocator off and
            # its next term rebuilds, which skips (and logs) undecodable inventory instead.
            for stream, subject in (("INVENTORY", "dra.inventory.fuzz.pool.g{}"), ("ALLOCATIONS", "dra.allocations.fuzz.g{}")):
                for i in range(10):
                    payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
                    garbage[(stream, (await jetstream(bus).publish(subject.format(i), payload)).seq)] = payload
                deadline = time.monotonic() + 30
                while True:
                    letters, decided = await dead_letters(bus), await outcomes(bus)
                    pending = [(n, k) for n, _, k in claims if ("CLAIMS", sequences[n]) not in letters and f"{NAMESPACE}/{n}" not in decided]
                    unlettered = [key for key in garbage if key not in letters]
                    if not (pending or unlettered) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                assert not pending and not unlettered, f"no reason for claims {pending}, garbage {unlettered}"

            for name, _, kind in claims:
                reason = letters.get(("CLAIMS", sequences[name]))
                decision = decided.get(f"{NAMESPACE}/{name}")
                if kind == "raw":
                    assert reason, f"{name}: undecodable, not dead-lettered"
                elif kind == "invalid":
                    assert reason or (isinstance(decision, ev.AllocationFailed) and decision.message), f"{name}: no reason given"
                    assert not isinstance(decision, ev.AllocationCommitted), f"{name}: an invalid claim was allocated"
            assert all(letters[key] for key in garbage)

            # Everyone survived: a good claim goes through the allocator and the status writer.
            started = time.monotonic()
            await bus.publish(claim_event("after-the-storm"))
            kv = await bus.key_value("dralloc-claims")
            async with asyncio.timeout(20):
                while not any(s.claim == f"{NAMESPACE}/after-the-storm" and s.state == "allocated" for s in await read_all(kv)):
                    await asyncio.sleep(0.1)
            assert system is not None and time.monotonic() - started < 20
