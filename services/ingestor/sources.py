"""Where claims come from: the `ClaimSource` protocol and the file source.

A source is an async iterator of events the ingestor publishes unchanged:
claims (`ClaimSubmitted` / `ClaimDeleted`) and the objects claims need
(`DeviceClassPublished` / `Removed`, `ResourceSlicePublished` / `Removed`,
`NodePublished` / `Removed`, `DeviceTaintRulePublished` / `Removed`). Bad input is reported through the `report`
callback (one line naming file, object and field) and never stops the source;
an object the Kubernetes API server would refuse (`dralloc.schemas.validation`)
is reported and not published (the translation of manifests into events is
`dralloc.manifest_events`, shared with `dralloc submit`).
Sources: `FileSource` here, `KubernetesSource` in ``kubernetes.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from dralloc.manifest_events import Report, SourceEvent, changes, events_from_manifests
from dralloc.manifests import expand_paths, load_paths


class ClaimSource(Protocol):
    """Optionally also ``async def seed(bus)``: called once before `events`, to resume from what the bus holds."""

    def events(self, stop: asyncio.Event) -> AsyncIterator[SourceEvent]:
        """Events in the order they should be published; ends when the source is exhausted or `stop` is set."""
        ...


@dataclass
class FileSource:
    """Manifests from files and directories; with `watch`, keeps polling for changes and removals."""

    paths: list[str]
    report: Report
    watch: bool = False
    interval: float = 2.0
    _state: dict[str, SourceEvent] = field(default_factory=dict)

    async def events(self, stop: asyncio.Event) -> AsyncIterator[SourceEvent]:
        fingerprint = None
        while not stop.is_set():
            now = _fingerprint(self.paths)
            if now != fingerprint:
                fingerprint = now
                manifests = await asyncio.to_thread(load_paths, self.paths)
                todo, self._state = changes(self._state, events_from_manifests(manifests, self.report))
                for event in todo:
                    yield event
            if not self.watch:
                return
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except TimeoutError:
                pass


def _fingerprint(paths: list[str]) -> tuple:
    """Cheap change detection: every manifest file's path, size and mtime."""
    items = []
    for file in expand_paths(paths):
        try:
            st = file.stat()
        except OSError:
            continue
        items.append((str(file), st.st_size, st.st_mtime_ns))
    return tuple(items)
