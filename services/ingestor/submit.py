"""`dralloc submit`: the file source, once, from the command line."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dralloc.bus import Bus, PublishRefused
from dralloc.ingestor.sources import Report, SourceEvent, events_from_manifests
from dralloc.manifests import load_paths


@dataclass(frozen=True)
class Published:
    event: str
    subject: str
    object: str
    sequence: int
    duplicate: bool


def describe(event: SourceEvent) -> str:
    """`Kind/namespace/name` of what an event is about."""
    for attr in ("claim", "device_class", "slice", "node"):
        obj = getattr(event, attr, None)
        if obj is not None:
            ns = f"{obj.metadata.namespace}/" if obj.metadata.namespace else ""
            return f"{obj.kind}/{ns}{obj.metadata.name}"
    return f"{type(event).__name__}/{getattr(event, 'key', None) or getattr(event, 'name', '')}"


async def submit_paths(paths: list[str], url: str | None, report: Report) -> list[Published]:
    """Read the files and publish what they hold; problems go to `report`, the rest is published."""
    todo = events_from_manifests(load_paths(paths), report)
    results: list[Published] = []
    if not todo:
        return results
    async with await Bus.connect(url, name="submit") as bus:
        await bus.ensure_streams()
        for event in todo:
            try:
                ack = await bus.publish(event)
            except PublishRefused as exc:
                report(f"{describe(event)}: not published: {exc}")
                continue
            results.append(Published(type(event).__name__, event.subject, describe(event), ack.seq, bool(ack.duplicate)))
    return results


def render(results: list[Published], output: str) -> None:
    if output == "json":
        rows = [
            {"event": r.event, "object": r.object, "subject": r.subject, "sequence": r.sequence, "duplicate": r.duplicate}
            for r in results
        ]
        print(json.dumps({"published": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("OBJECT", "EVENT", "RESULT", box=None, header_style="bold")
    for r in results:
        table.add_row(r.object, r.event, "unchanged (already published)" if r.duplicate else f"published (seq {r.sequence})")
    Console().print(table)
