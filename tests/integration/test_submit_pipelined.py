"""`dralloc submit`'s publishing pipelined (`dralloc.client.submit`): many events on their way at once,
each stored once and in order, a subject's events never reordered, duplicates told from news, over a
real nats-server."""

from __future__ import annotations

import json
from pathlib import Path

from dralloc.bus import Bus
from dralloc.client.submit import PUBLISH_WINDOW, delete_paths, segments, submit_paths
from dralloc.manifest_events import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev


def claim_file(directory: Path, file: str, name: str, count: int = 1) -> str:
    """A claim manifest as a user writes it (no uid: the submit path derives one from the spec)."""
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [request]}},
    }
    path = directory / file
    path.write_text(json.dumps(doc))
    return str(path)


def test_segments_keep_order_and_never_hold_a_subject_twice(tmp_path: Path) -> None:
    paths = [claim_file(tmp_path, f"{i}.json", f"c-{i % 5}", count=1 + i // 5) for i in range(12)]
    todo = events_from_manifests(load_paths(paths), lambda problem: None)
    runs = segments(todo, window=4)
    assert [event for run in runs for event in run] == todo  # nothing lost, nothing moved
    assert all(len(run) <= 4 for run in runs)
    assert all(len({event.subject for event in run}) == len(run) for run in runs)
    assert [len(run) for run in runs] == [4, 4, 4]  # cut at the window
    assert [len(run) for run in segments(todo, window=10)] == [5, 5, 2]  # cut where a name comes again
    assert segments([]) == []


async def test_more_claims_than_the_window_are_each_stored_once_in_file_order(bus: Bus, tmp_path: Path) -> None:
    count = PUBLISH_WINDOW * 2 + 7
    paths = [claim_file(tmp_path, f"c-{i:04d}.json", f"c-{i}") for i in range(count)]
    problems: list[str] = []
    first = await submit_paths(paths, None, problems.append, bus=bus)
    assert problems == []
    assert [p.object for p in first.published] == [f"ResourceClaim/ml/c-{i}" for i in range(count)]
    sequences = [p.sequence for p in first.published]
    assert sequences == sorted(sequences) and len(set(sequences)) == count
    assert not any(p.duplicate for p in first.published)
    assert (await bus.stream_state("CLAIMS")).messages == count

    again = await submit_paths(paths, None, problems.append, bus=bus)  # a retry: every one a duplicate
    assert all(p.duplicate for p in again.published) and len(again.published) == count
    assert [p.sequence for p in again.published] == sequences
    assert (await bus.stream_state("CLAIMS")).messages == count


async def test_one_claim_twice_in_a_submit_ends_at_the_later_version(bus: Bus, tmp_path: Path) -> None:
    # The same name with two specs (two uids): both stored, the later one last on the subject.
    paths = [claim_file(tmp_path, "a.json", "a", count=1), claim_file(tmp_path, "b.json", "other"), claim_file(tmp_path, "c.json", "a", count=2)]
    result = await submit_paths(paths, None, lambda problem: None, bus=bus)
    assert [(p.object, p.duplicate) for p in result.published] == [
        ("ResourceClaim/ml/a", False),
        ("ResourceClaim/ml/other", False),
        ("ResourceClaim/ml/a", False),
    ]
    last = await bus.last_message("CLAIMS", ev.subject("claims", "ml", "a"))
    assert last is not None and last.sequence == result.published[2].sequence
    stored = ev.decode(last.data)
    assert isinstance(stored, ev.ClaimSubmitted)
    assert stored.claim.spec.devices.requests[0].exactly.count == 2  # type: ignore[union-attr]


async def test_a_claim_submitted_again_after_its_delete_is_news_not_a_duplicate(bus: Bus, nats_url: str, tmp_path: Path) -> None:
    paths = [claim_file(tmp_path, "a.json", "a"), claim_file(tmp_path, "b.json", "b")]
    first = await submit_paths(paths, None, lambda problem: None, bus=bus)
    await delete_paths(paths[:1], nats_url, lambda problem: None)
    # Same uid and generation, so the same message id, within the duplicate window: the server calls
    # it a duplicate, and the careful publish stores it all the same (the subject moved on).
    again = await submit_paths(paths, None, lambda problem: None, bus=bus)
    assert [(p.object, p.duplicate) for p in again.published] == [("ResourceClaim/ml/a", False), ("ResourceClaim/ml/b", True)]
    assert again.published[0].sequence > first.published[1].sequence
    last = await bus.last_message("CLAIMS", ev.subject("claims", "ml", "a"))
    assert last is not None and isinstance(ev.decode(last.data), ev.ClaimSubmitted)
