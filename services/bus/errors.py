"""The bus's own errors, and the nats-py errors the rest of dralloc catches.

nats-py's are re-exported here (and from `dralloc.bus`) so that only the bus package imports
nats-py (tests/test_architecture.py: nats-through-bus).
"""

from __future__ import annotations

import nats.errors
import nats.js.errors

NatsError = nats.errors.Error
"""Anything nats-py raises: connection lost, timeout, no responders, a refusal by the server."""
NatsTimeout = nats.errors.TimeoutError
"""nats-py's timeout (also a `TimeoutError`)."""
NotFound = nats.js.errors.NotFoundError
"""A stream, consumer or message that does not exist."""
ApiError = nats.js.errors.APIError
"""An error answer from the JetStream API (e.g. a refused batch or expected sequence)."""
KeyNotFound = nats.js.errors.KeyNotFoundError
"""A KV key that was never written, or was deleted."""
NoKeys = nats.js.errors.NoKeysError
"""A KV bucket without keys."""
KeyWrongLastSequence = nats.js.errors.KeyWrongLastSequenceError
"""A KV compare-and-set that lost: the key changed since it was read."""


class Permanent(Exception):
    """Raised by a handler for a message that can never be processed: it is dead-lettered, not retried."""


class BusError(Exception):
    """The bus cannot be reached or used; the message says what to check."""


class PublishRefused(BusError):
    """This event can never be published (too large for the server): retrying will not help."""


class ReplicaBehind(nats.errors.TimeoutError):
    """A read through a consumer ended short of what the stream's leader holds: the consumer was
    placed on a replica still catching up (JetStream puts a reading consumer on any of the stream's
    servers). Like a timeout, it is over once that replica has caught up: read again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # (nats-py's errors say only their kind)
        return self.message
