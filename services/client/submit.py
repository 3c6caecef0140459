"""`dralloc submit`: the file source, once, from the command line (optionally waiting for the decisions)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass, field

import msgspec

from dralloc import telemetry
from dralloc.bus import Bus, PublishRefused
from dralloc.manifest_events import Report, SourceEvent, events_from_manifests, removal_of
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.status import ClaimStatus, status_of


@dataclass(frozen=True)
class Published:
    event: str
    subject: str
    object: str
    sequence: int
    duplicate: bool


@dataclass
class Submission:
    published: list[Published] = field(default_factory=list)
    decisions: list[ClaimStatus] | None = None
    """With a wait: each submitted claim's decision (``pending`` when none came in time)."""


def describe(event: SourceEvent) -> str:
    """`Kind/namespace/name` of what an event is about."""
    for attr in ("claim", "device_class", "slice", "node"):
        obj = getattr(event, attr, None)
        if obj is not None:
            ns = f"{obj.metadata.namespace}/" if obj.metadata.namespace else ""
            return f"{obj.kind}/{ns}{obj.metadata.name}"
    kind = {"ClaimDeleted": "ResourceClaim", "DeviceClassRemoved": "DeviceClass", "ResourceSliceRemoved": "ResourceSlice", "NodeRemoved": "Node"}
    return f"{kind.get(type(event).__name__, type(event).__name__)}/{getattr(event, 'key', None) or getattr(event, 'name', '')}"


def as_gang(events: list[SourceEvent], name: str, domain: str | None = None) -> list[SourceEvent]:
    """Mark every claim as one gang (the annotations the allocator reads): all of them, or none.
    `domain`: the node label key whose values are the gang's domains ("": any nodes; None: the default)."""
    from dralloc.schemas.gang import GANG, GANG_DOMAIN, GANG_SIZE

    size = sum(isinstance(e, ev.ClaimSubmitted) for e in events)

    def marked(event: SourceEvent) -> SourceEvent:
        if not isinstance(event, ev.ClaimSubmitted):
            return event
        meta = event.claim.metadata
        annotations = {**meta.annotations, GANG: name, GANG_SIZE: str(size)}
        if domain is not None:
            annotations[GANG_DOMAIN] = domain
        return ev.ClaimSubmitted(claim=msgspec.structs.replace(event.claim, metadata=msgspec.structs.replace(meta, annotations=annotations)))

    return [marked(event) for event in events]


async def submit_paths(
    paths: list[str],
    url: str | None,
    report: Report,
    *,
    wait: float = 0.0,
    gang: str | None = None,
    gang_domain: str | None = None,
    bus: Bus | None = None,
) -> Submission:
    """Read the files and publish what they hold; problems go to `report`, the rest is published.

    With `wait` > 0, also wait up to that many seconds for the allocator's decision on each claim
    (`decisions`), returning as soon as every claim is allocated or failed for good (an error).
    With `gang`, the claims form one gang: allocated all together inside one topology domain
    (`gang_domain`: a node label key, "" for any nodes), or not at all.
    `bus`: a connection the caller keeps open (and whose streams it has ensured), for a program that
    submits again and again (`dralloc bench pipeline`); without it each call connects and closes.
    """
    telemetry.setup("submit")  # each claim's trace starts here
    todo = events_from_manifests(load_paths(paths), report)
    if gang:
        todo = as_gang(todo, gang, gang_domain)
    result = Submission()
    if not todo:
        return result
    if bus is not None:
        return await _publish(bus, todo, report, wait, result)
    async with await Bus.connect(url, name="submit") as own:
        await own.ensure_streams()
        return await _publish(own, todo, report, wait, result)


PUBLISH_WINDOW = 256
"""Events `_publish` has on their way at once (sent, their store not yet confirmed), at most."""


def segments(todo: list[SourceEvent], window: int = PUBLISH_WINDOW) -> list[list[SourceEvent]]:
    """`todo` cut, in order, into runs of at most `window` events in which no subject comes twice."""
    runs: list[list[SourceEvent]] = []
    subjects: set[str] = set()
    for event in todo:
        if not runs or len(runs[-1]) >= window or event.subject in subjects:
            runs.append([])
            subjects = set()
        runs[-1].append(event)
        subjects.add(event.subject)
    return runs


async def _publish(bus: Bus, todo: list[SourceEvent], report: Report, wait: float, result: Submission) -> Submission:
    """Publish `todo` in order (a refused event is reported and skipped); with `wait`, the decisions too.

    Pipelined: a segment's events (`segments`) are sent one after the other without waiting, then
    every one's store is awaited (one round trip a segment, not one an event). Messages leave in
    order, so a subject's events are stored in order. A duplicate is published once more the
    careful way (`Bus.publish`: a retry stays a duplicate, news after a delete is stored); since a
    segment holds each subject once, that second publish never overtakes a later event on its
    subject. An error (NATS away, no answer in time) is raised once the segment's sends are settled."""
    claims: list[ev.ClaimSubmitted] = []
    for segment in segments(todo):
        sent: list[SourceEvent] = []
        acks = []
        for event in segment:
            try:
                acks.append(await bus.send(event))
            except PublishRefused as exc:
                report(f"{describe(event)}: not published: {exc}")
                continue
            sent.append(event)
        answers = await asyncio.gather(*acks, return_exceptions=True)
        for event, answer in zip(sent, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer
            ack = await bus.publish(event) if answer.duplicate else answer
            result.published.append(Published(type(event).__name__, event.subject, describe(event), ack.seq, bool(ack.duplicate)))
            if isinstance(event, ev.ClaimSubmitted):
                claims.append(event)
    if wait > 0:
        result.decisions = await _decisions(bus, claims, wait)
    return result


async def delete_paths(paths: list[str], url: str | None, report: Report) -> Submission:
    """Publish the removal of every object in the files (claims: ClaimDeleted, so their devices are released)."""
    telemetry.setup("delete")
    todo = [undo for event in events_from_manifests(load_paths(paths), report) if (undo := removal_of(event)) is not None]
    result = Submission()
    if not todo:
        return result
    async with await Bus.connect(url, name="delete") as bus:
        await bus.ensure_streams()
        for event in todo:
            ack = await bus.publish(event)
            result.published.append(Published(type(event).__name__, event.subject, describe(event), ack.seq, bool(ack.duplicate)))
    return result


POLL_SECONDS = 0.2
"""How often `--wait` reads each claim's latest decision (one direct get per claim)."""


CLASS_NOT_KNOWN = re.compile(r"device class .+ not found")
"""The engine's error for a request naming a DeviceClass the allocator does not know (engine/plan.py)."""


def settled(status: ClaimStatus | None) -> bool:
    """A decision `--wait` need not wait beyond: allocated, or failed for good (an error; the
    allocator retries an unsatisfiable claim when the inventory changes).

    An error naming a device class not found is not for good: the allocator decides such a claim
    again once the inventory changes, and the class may still come. A class published with its
    claims (one file) is read before they are decided (allocator/catchup.py), so they see no such
    error; a class published after the claim was decided (another submit, a later file) does turn
    the error into a decision, and `--wait` waits for it."""
    if status is None:
        return False
    return status.state == "allocated" or (status.state == "error" and not CLASS_NOT_KNOWN.search(status.message))


async def _decisions(bus: Bus, claims: list[ev.ClaimSubmitted], wait: float) -> list[ClaimStatus]:
    """The latest decision about each claim (this very object: same uid), polling ALLOCATIONS
    directly, until every claim is settled or `wait` seconds have passed."""
    deadline = time.monotonic() + wait
    found: dict[str, ClaimStatus] = {}
    while True:
        for submitted in claims:
            meta = submitted.claim.metadata
            key = submitted.claim.key
            if settled(found.get(key)):
                continue
            # the decision's own subject (namespace and name as the allocator writes them)
            stored = await bus.last_message("ALLOCATIONS", ev.subject("allocations", meta.namespace or "default", meta.name))
            if stored is None:
                continue
            try:
                decision = ev.decode(stored.data)
            except ev.EventDecodeError:
                continue
            if isinstance(decision, ev.AllocationCommitted | ev.AllocationFailed) and decision.uid == meta.uid:
                found[key] = status_of(decision)
        if all(settled(found.get(c.claim.key)) for c in claims) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    pending = ClaimStatus(claim="", uid="", state="pending", message="no decision yet")
    return [found.get(c.claim.key) or msgspec.structs.replace(pending, claim=c.claim.key, uid=c.claim.metadata.uid or "") for c in claims]


def unsettled_summary(decisions: list[ClaimStatus], wait: float) -> str:
    """One line for the end of a `--wait`: which claims are still unsatisfiable or undecided."""
    unsatisfiable = [d.claim for d in decisions if d.state == "unsatisfiable"]
    no_class = [d.claim for d in decisions if d.state == "error" and not settled(d)]
    pending = [d.claim for d in decisions if d.state == "pending"]
    parts = []
    if unsatisfiable:
        parts.append(f"still unsatisfiable: {', '.join(unsatisfiable)}")
    if no_class:
        parts.append(f"device class still not found: {', '.join(no_class)}")
    if pending:
        parts.append(f"no decision yet: {', '.join(pending)}")
    return f"after {wait:g}s, {'; '.join(parts)}" if parts else ""


def render(submission: Submission, output: str) -> None:
    if output == "json":
        rows = [{"event": r.event, "object": r.object, "subject": r.subject, "sequence": r.sequence, "duplicate": r.duplicate} for r in submission.published]
        doc: dict = {"published": rows}
        if submission.decisions is not None:
            doc["claims"] = msgspec.to_builtins(submission.decisions)
        print(json.dumps(doc, indent=2))
        return
    from dralloc.client.get import console_for, table
    from dralloc.client.show import claims_table

    console = console_for(sys.stdout.isatty())  # piped: names are never cut
    if submission.decisions is not None:
        console.print(claims_table(submission.decisions))
        return
    published = table("OBJECT", "EVENT", "RESULT")
    for r in submission.published:
        published.add_row(r.object, r.event, "unchanged (already published)" if r.duplicate else f"published (seq {r.sequence})")
    console.print(published)
