"""The claim ingestor: reads claims (and the classes and slices they need) from a source and publishes them.

    dralloc run ingestor --source files -f examples/ [--watch]
    dralloc run ingestor --source kubernetes [--namespace NS]

Environment: ``DRALLOC_INGESTOR_SOURCE``, ``DRALLOC_INGESTOR_PATHS`` (paths
separated by ``:``), ``DRALLOC_INGESTOR_WATCH`` (default true: a service keeps
following its files; ``false`` publishes once and exits),
``DRALLOC_INGESTOR_INTERVAL`` (seconds), ``DRALLOC_INGESTOR_NAMESPACE``,
``KUBECONFIG``; flags override them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from dralloc.bus import Bus, NatsError, PublishRefused
from dralloc.ingestor.publishing import publish_events
from dralloc.ingestor.sources import ClaimSource, FileSource, SourceEvent
from dralloc.schemas import events as ev
from dralloc.settings import env_flag, env_seconds, one_of, overridden

log = logging.getLogger("dralloc.ingestor")


Source = Literal["files", "kubernetes"]
SOURCES: tuple[Source, ...] = ("files", "kubernetes")


@dataclass
class Config:
    source: Source = "files"
    paths: list[str] = field(default_factory=list)
    watch: bool = False
    interval: float = 2.0
    namespace: str | None = None
    """Kubernetes source: watch one namespace (default: all)."""
    kubeconfig: str | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        env = os.environ
        source = overrides.pop("source", None) or env.get("DRALLOC_INGESTOR_SOURCE", "files")  # (the flag over the variable)
        config = cls(
            source=one_of(source, SOURCES, "source"),
            paths=[p for p in env.get("DRALLOC_INGESTOR_PATHS", "").split(os.pathsep) if p],
            watch=env_flag("DRALLOC_INGESTOR_WATCH", default=True),
            interval=env_seconds("DRALLOC_INGESTOR_INTERVAL", 2.0),
            namespace=env.get("DRALLOC_INGESTOR_NAMESPACE") or None,
            kubeconfig=env.get("KUBECONFIG") or None,
        )
        overridden(config, overrides)
        if config.source == "files" and not config.paths:
            raise ValueError("the file source needs manifests: -f PATH or DRALLOC_INGESTOR_PATHS")
        return config


def make_source(config: Config) -> ClaimSource:
    if config.source == "kubernetes":
        from dralloc.ingestor.kubernetes import KubernetesSource  # only when asked: needs a cluster

        return KubernetesSource(config, report=_report)
    return FileSource(config.paths, report=_report, watch=config.watch, interval=config.interval)


def _report(problem: str) -> None:
    log.warning("%s", problem)


async def publish_until_stored(bus: Bus, event: SourceEvent, stop: asyncio.Event) -> bool:
    """Publish, retrying while NATS is unreachable; False if stopped first. An event that can
    never be published is reported and skipped, and so is one about a name the API server would
    refuse (every source: a cluster's objects are checked as the files' are)."""
    if (problem := ev.identity_problem(event)) is not None:
        _report(f"not published: {type(event).__name__}: {problem}")
        return True
    delay = 0.1
    while not stop.is_set():
        try:
            await bus.publish(event)
            return True
        except PublishRefused as exc:
            _report(f"not published: {exc}")
            return True  # nothing to retry; go on with the rest
        except (NatsError, TimeoutError, OSError) as exc:
            log.warning("publishing %s failed: %s; retrying in %.1fs", event.subject, exc, delay)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 5.0)
    return False


async def serve(bus: Bus, config: Config, stop: asyncio.Event, *, source: ClaimSource | None = None) -> None:
    """Publish everything the source yields until it ends or `stop` is set."""
    source = source or make_source(config)
    if (seed := getattr(source, "seed", None)) is not None:
        await seed(bus)  # a source that can resume skips what the bus already has
    # Pipelined: many events on their way at once, each retried until stored (publishing.py).
    published = await publish_events(bus, source.events(stop), stop, lambda event: publish_until_stored(bus, event, stop), _report)
    log.info("ingestor: published %d events", published)
