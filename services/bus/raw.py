"""A `Bus`'s raw nats-py handles, for the tests and benchmarks that meddle with the server on purpose.

A fault test weakens a stream, publishes bytes no service would, wraps the connection's publish to
cut a batch short; a benchmark copies a stream's configuration. Services never do: they reach NATS
only through `Bus`'s methods, and tests/test_architecture.py fails a `dralloc` module outside the bus
that imports this module or touches a bus's handles (``.js``/``.nc``/``._js``/``._nc``). Keeping the
escape hatch in one named place is what makes that contract checkable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import nats
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

__all__ = ["DiscardPolicy", "connection", "jetstream"]


def jetstream(bus: Bus) -> JetStreamContext:
    """The bus's own JetStream context (the same object every call: patching it patches the bus's)."""
    return bus._js


def connection(bus: Bus) -> nats.NATS:
    """The bus's own NATS connection (the same object every call: patching it patches the bus's)."""
    return bus._nc
