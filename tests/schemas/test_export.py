"""The generated contract files: in sync with the code, valid, and describing real messages."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from dralloc.schemas import events as ev
from dralloc.schemas import export
from dralloc.schemas.resource import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimStatus,
)

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_checked_in_files_match_the_code():
    stale = export.drift(SCHEMAS)
    assert stale == [], f"run `dralloc schemas export`: {stale} differ from dralloc.schemas.events"


def test_drift_detects_changed_missing_and_stale_files(tmp_path: Path):
    export.write(tmp_path)
    assert export.drift(tmp_path) == []
    (tmp_path / "jsonschema" / "ClaimDeleted.json").write_text("{}\n")
    (tmp_path / "asyncapi.yaml").unlink()
    (tmp_path / "jsonschema" / "OldEvent.json").write_text("{}\n")
    assert export.drift(tmp_path) == ["jsonschema/ClaimDeleted.json", "asyncapi.yaml", "jsonschema/OldEvent.json"]
    export.write(tmp_path)
    assert export.drift(tmp_path) == []


def committed() -> ev.AllocationCommitted:
    result = DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="n1", device="gpu-0")
    claim = ResourceClaim(
        metadata=ObjectMeta(name="c", namespace="ml", uid="u"),
        status=ResourceClaimStatus(allocation=AllocationResult(devices=DeviceAllocationResult(results=[result]))),
    )
    return ev.AllocationCommitted(claim=claim, node="n1")


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
def test_each_event_schema_is_valid_json_schema(cls: type):
    schema = json.loads((SCHEMAS / "jsonschema" / f"{cls.__name__}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["title"] == cls.__name__


@pytest.mark.parametrize(
    "event",
    [
        committed(),
        ev.AllocationFailed(namespace="ml", name="c", uid="u", generation=1, reason="error", message="bad"),
        ev.ClaimDeleted(namespace="ml", name="c", uid="u"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_real_messages_validate_and_wrong_ones_do_not(event: ev.Event):
    schema = json.loads((SCHEMAS / "jsonschema" / f"{type(event).__name__}.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    message = json.loads(ev.encode(event))
    validator.validate(message)
    wrong_tag = {**message, "type": "SomethingElse"}
    assert not validator.is_valid(wrong_tag)
    missing = {k: v for k, v in message.items() if k not in ("claim", "name")}
    assert not validator.is_valid(missing)


def test_asyncapi_document_covers_every_event_and_every_ref_resolves():
    doc = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text())
    assert doc["asyncapi"].startswith("3.")
    messages = {m for channel in doc["channels"].values() for m in channel.get("messages", {})}
    assert messages == {cls.__name__ for cls in ev.EVENT_TYPES}
    # Every channel address matches the subjects the events really use (tokens as parameters).
    addresses = {name: channel["address"] for name, channel in doc["channels"].items()}
    assert addresses["claims"] == "dra.claims.{namespace}.{name}"
    assert ev.ClaimDeleted(namespace="a", name="b").subject == "dra.claims.a.b"
    assert committed().subject == addresses["allocations"].format(namespace="ml", name="c")

    def refs(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    yield value
                else:
                    yield from refs(value)
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    for ref in set(refs(doc)):
        target = doc
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]  # KeyError: a dangling reference
    payload_schema = {"$ref": "#/components/schemas/AllocationCommitted", "components": doc["components"]}
    jsonschema.Draft202012Validator(payload_schema).validate(json.loads(ev.encode(committed())))
