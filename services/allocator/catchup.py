"""Reading INVENTORY far enough before deciding a claim that names a device class not yet known.

The allocator reads CLAIMS and INVENTORY with two consumers, apart: a file of classes and claims
published in one go (`dralloc submit -f`) can reach it claim first, and deciding the claim then
would write a transient ``error: device class ... not found`` that the class, already stored,
turns into an allocation a moment later. So before claims naming a class it does not know are
decided, the allocator asks INVENTORY for its last sequence and waits until its inventory reader
has read that far (`InventoryMark`): what was stored before the claim was decided is applied. A
class that does not exist costs one round trip (the reader has already read everything); a
reader that does not get there in `CATCH_UP_SECONDS` (stuck, or the stream purged under it) does
not stall the claims: they are decided with what is known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from dralloc.bus import Bus
from dralloc.schemas.resource import ResourceClaim

log = logging.getLogger("dralloc.allocator")

CATCH_UP_SECONDS = 5.0
"""How long claims naming an unknown class wait for the inventory reader, at most."""


def class_names(claim: ResourceClaim) -> Iterable[str]:
    """The DeviceClasses a claim names (each request's, or each of its firstAvailable alternatives')."""
    for request in claim.spec.devices.requests:
        if request.exactly is not None:
            yield request.exactly.device_class_name
        else:
            for sub in request.first_available or ():
                yield sub.device_class_name


def names_unknown_class(claims: Iterable[ResourceClaim], known: Mapping[str, object]) -> bool:
    """Whether any of `claims` names a class that is not in `known` (pure)."""
    return any(name not in known for claim in claims for name in class_names(claim))


class InventoryMark:
    """How far the allocator's inventory reader has read INVENTORY (a stream sequence), and a way to
    wait until it has read further."""

    def __init__(self, seq: int = 0) -> None:
        self.seq = seq
        """The last INVENTORY sequence applied (or refused): everything up to it is known."""
        self.waits = 0
        """How many times claims waited for the reader (the stream held more than it had read)."""
        self._advanced = asyncio.Event()

    def read(self, seq: int) -> None:
        """The reader is done with the message at `seq` (`Bus.consume`'s ``seen``)."""
        if seq > self.seq:
            self.seq = seq
            self._advanced.set()

    async def reach(self, seq: int) -> None:
        """Return once the reader has read up to `seq`."""
        while self.seq < seq:
            self._advanced.clear()
            await self._advanced.wait()

    async def catch_up(self, bus: Bus, term: asyncio.Event, timeout: float = CATCH_UP_SECONDS) -> bool:
        """Wait until everything INVENTORY holds now is read; False if the reader did not get there
        within `timeout` seconds, or the term ended meanwhile (the caller decides with what is known)."""
        last = (await bus.stream_state("INVENTORY")).last_sequence
        if self.seq >= last:
            return True
        self.waits += 1
        reached, ended = asyncio.ensure_future(self.reach(last)), asyncio.ensure_future(term.wait())
        try:
            await asyncio.wait((reached, ended), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reached.cancel()
            ended.cancel()
        if self.seq < last and not term.is_set():
            log.warning("allocator: the inventory reader is at %d of INVENTORY's %d after %.0f s; deciding with what is known", self.seq, last, timeout)
        return self.seq >= last
