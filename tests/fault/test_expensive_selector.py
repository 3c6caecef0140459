"""Issue #11 item 6 with real processes: a selector within Kubernetes' limits that costs ~0.5 s per
device (three nested comprehensions over 64 elements, and a lookup that always fails, so that the
reference interpreter re-decides every device) among ordinary claims, leader + standby allocators.

Before: the leader's event loop was blocked for the whole claim, its lease expired, the standby took
the same claim first, and the two took turns for minutes while the other claims waited; SIGTERM
was not seen. Now the claim spends its evaluation budget (DRALLOC_CEL_BUDGET cost units, or
DRALLOC_CEL_BUDGET_SECONDS) in a worker thread and ends as an `error`, the lease stays where it is, the others are decided meanwhile, and a
SIGTERM during such an evaluation ends the process at once.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from pipeline import Stack, StreamReader, check, claim_event, offer, settle

from dralloc.bus import Bus
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim

BUDGET = 3_000_000  # three evaluations of the selector below (807,259 each); the time budget is the default (2 s)


def expensive(name: str, first: int = 0) -> ev.ClaimSubmitted:
    items = ", ".join(str(i) for i in range(first, first + 64))
    # the uuid differs per device, so no two devices share a verdict (engine/projection.py):
    # every device is a full evaluation, and the budget runs out before the fleet does
    expression = f'cel.bind(l, [{items}], l.all(a, l.all(b, l.all(c, true)))) && device.attributes["gpu.nvidia.com"].uuid == "no such GPU"'
    raw = msgspec.to_builtins(claim_event(name).claim)
    raw["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return ev.ClaimSubmitted(claim=msgspec.convert(raw, ResourceClaim))


def outcomes(stored: list, name: str) -> list[ev.AllocationEvent]:
    return [s.event for s in stored if isinstance(s.event, ev.AllocationCommitted | ev.AllocationFailed) and s.event.key.split("/", 1)[1] == name]


async def test_an_expensive_selector_ends_as_an_error_without_stalling_or_moving_the_lease():
    async with Stack(nodes=4, allocators=2, env={"DRALLOC_CEL_BUDGET": str(BUDGET)}) as stack, await Bus.connect(stack.nats.url, name="test") as bus:
        await stack.ready(bus)
        leader = await stack.leader_pid(bus)
        decisions = StreamReader(bus, "ALLOCATIONS")
        await decisions.read_new()
        before = len(decisions.seen)

        await bus.publish(expensive("costly-0"))
        others = [f"other-{i}" for i in range(10)]
        await offer(bus, others, None, asyncio.Event())
        verdict = await settle(bus, {*others, "costly-0"}, 10)  # every claim decided within 10 s
        assert verdict.lost == 0 and verdict.duplicated == 0 and verdict.double_allocated_devices == 0

        await decisions.read_new()
        (failed,) = outcomes(decisions.seen, "costly-0")
        assert isinstance(failed, ev.AllocationFailed) and failed.reason == "error"
        assert "budget" in failed.message  # cost units or time, whichever is spent first
        for name in others:
            assert [type(e) for e in outcomes(decisions.seen, name)] == [ev.AllocationCommitted]
        # no ping-pong: one leader, one term, for every decision since
        assert await stack.leader_pid(bus) == leader
        assert {s.headers["Dralloc-Epoch"] for s in decisions.seen[before:]} == {decisions.seen[-1].headers["Dralloc-Epoch"]}

        # SIGTERM while the leader evaluates another such claim: it exits at once
        service = next(s for s in stack.allocators_() if s.pid == leader)
        await bus.publish(expensive("costly-1", first=1))
        await asyncio.sleep(0.5)
        stopped = time.monotonic()
        service.proc.terminate()  # type: ignore[union-attr]
        await asyncio.wait_for(service.proc.wait(), 5)  # type: ignore[union-attr]
        assert time.monotonic() - stopped < 5

        # the standby takes over: costly-1 ends as an error too, and its rebuild does not evaluate
        # costly-0 again (one failure, the first term's)
        verdict = await settle(bus, {*others, "costly-0", "costly-1"}, 30)
        assert verdict.lost == 0 and verdict.double_allocated_devices == 0
        await decisions.read_new()
        (failed,) = outcomes(decisions.seen, "costly-1")
        assert isinstance(failed, ev.AllocationFailed) and failed.reason == "error" and "budget" in failed.message
        assert len(outcomes(decisions.seen, "costly-0")) == 1
        claims = StreamReader(bus, "CLAIMS")
        await claims.read_new()
        assert check(claims.seen, decisions.seen).double_allocated_devices == 0
        for log in stack.root.glob("allocator-*.log"):
            assert "Traceback" not in log.read_text(errors="replace"), log.name
