"""Issue #11's attacks, one by one, against the services as processes under auth.conf.

Each test sends one attack of the corpus (benchmarks/hostile.py) with the credential an
attacker would hold, asserts what the attack specifically must not achieve, then
`Harness.verify`: every service alive and a fresh valid claim decided within 10 s, no
device held by two live claims, no running claim moved, nothing lost or duplicated, no
traceback and no password in any log.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import hostile
import pytest
from hostile import HOSTILE, Harness, attack, committed_to
from pipeline import NAMESPACE

from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def letters_for(h: Harness, subject: str) -> list:
    return [letter for letter in await h.admin.dead_letters(500) if letter.subject == subject]


async def test_a_message_just_under_max_payload_is_dead_lettered_cut_and_the_consumer_goes_on(h: Harness):
    outcome = await attack(h, "oversized")
    big = hostile.claim_subject(HOSTILE, "big")
    assert big in outcome.stored  # the server took it: the consumer had to cope
    async with asyncio.timeout(10):
        while not (letters := await letters_for(h, big)):
            await asyncio.sleep(0.2)
    assert 0 < len(letters[0].data) < h.admin.max_payload - 256  # cut, so that it fits with its headers
    assert letters[0].original_sequence > 0  # the original is found by stream and sequence


async def test_deeply_nested_json_is_refused_on_every_stream(h: Harness):
    outcome = await attack(h, "nested")
    for name in ("deep-bare", "deep-unknown", "deep-config"):
        assert not await committed_to(h, HOSTILE, name)
    assert len(outcome.stored) == 4


async def test_the_ingestor_cannot_forge_a_decision(h: Harness):
    outcome = await attack(h, "forged-decision")
    assert ev.subject("allocations", HOSTILE, "forged") not in outcome.stored  # refused by the server
    assert hostile.claim_subject(HOSTILE, "forged") in outcome.stored  # stored in CLAIMS, but never acted on
    async with asyncio.timeout(10):
        while not await letters_for(h, hostile.claim_subject(HOSTILE, "forged")):
            await asyncio.sleep(0.2)
    assert not await committed_to(h, HOSTILE, "forged")


async def test_an_event_filed_under_another_claims_subject_is_never_acted_on(h: Harness):
    await attack(h, "misfiled")
    assert not await committed_to(h, HOSTILE, "smuggled")
    letters = await letters_for(h, hostile.claim_subject(HOSTILE, "decoy"))
    assert any("names another object" in letter.reason for letter in letters)


async def test_no_service_user_may_weaken_streams_or_touch_another_services_consumer(h: Harness):
    before = {s: (await jetstream(h.admin).stream_info(s)).config for s in ("INVENTORY", "CLAIMS", "ALLOCATIONS", "DEADLETTER")}
    outcome = await attack(h, "jetstream-api")
    assert outcome.stored == [], outcome.stored
    assert outcome.sent == len(outcome.refused)
    for name, config in before.items():
        assert (await jetstream(h.admin).stream_info(name)).config == config
    consumer = await jetstream(h.admin).consumer_info("CLAIMS", "allocator")
    assert consumer.config.filter_subject in (None, "")  # not redirected


async def test_a_claim_submitted_deleted_and_submitted_again_in_the_duplicate_window_is_decided_again(h: Harness):
    outcome = await attack(h, "resubmission")
    assert outcome.refused == [], outcome.refused  # the third submit was stored, not dropped as a duplicate
    key = f"{NAMESPACE}/resubmitted"
    async with asyncio.timeout(10):
        while True:
            await h.allocations.read_new()
            kinds = [type(s.event).__name__ for s in h.allocations.seen if getattr(s.event, "key", None) == key]
            if kinds == ["AllocationCommitted", "AllocationReleased", "AllocationCommitted"]:
                break
            await asyncio.sleep(0.2)


async def test_a_node_credential_publishes_only_its_own_nodes_slices(h: Harness):
    outcome = await attack(h, "node-credential")
    assert any(s.split(".")[3] == hostile.NODE_USER for s in outcome.stored)
    assert all(s.split(".")[3] == hostile.NODE_USER for s in outcome.stored if s.startswith("dra.inventory."))
    assert any(r.startswith("dra.inventory.") for r in outcome.refused)  # another node's slice
    assert any(r.startswith(hostile.claim_subject(HOSTILE, "from-a-node")) for r in outcome.refused)


async def test_credentials_in_a_nats_url_are_never_logged(h: Harness):
    await attack(h, "secrets-in-urls")  # verify looked for every password in every log
    closed_port = (h.stack.root / "statuswriter-closed-port.log").read_text()
    assert "cannot connect to NATS at nats://***@127.0.0.1:1" in closed_port
    started = sorted(h.stack.root.glob("statuswriter.*.log"))[-1].read_text()
    assert "serving (NATS nats://***@127.0.0.1:" in started  # the start line names the server, not the password


async def test_mutated_and_oversized_events_on_every_stream_with_every_credential(h: Harness):
    outcome = await attack(h, "mutated-everywhere")
    # each user got through only on its own subjects: the ingestor CLAIMS, discovery INVENTORY, the allocator ALLOCATIONS
    assert {s.split(".")[1] for s in outcome.stored} == {"claims", "inventory", "allocations"}
    assert len(outcome.refused) > len(outcome.stored)  # every other (user, stream) pair was refused


async def test_every_allocator_restarted_rebuilds_without_what_the_attacks_left(h: Harness):
    await attack(h, "rebuild")
    for name in ("forged", "smuggled", "deep-bare", "deep-unknown", "deep-config"):
        assert not await committed_to(h, HOSTILE, name)


async def test_get_claims_and_get_deadletters_survive_what_the_attacks_left(h: Harness):
    url = h.credentials.url(h.stack.nats.url, "admin")
    for command in (["get", "claims"], ["get", "deadletters"]):
        done = subprocess.run([sys.executable, "-m", "dralloc.cli", *command, "--nats-url", url], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        assert h.credentials.passwords["admin"] not in done.stdout + done.stderr
