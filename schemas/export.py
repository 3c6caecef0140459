"""The bus contract as language-neutral files, generated from `dralloc.schemas.events`.

- ``jsonschema/<Event>.json``: a JSON Schema (2020-12) per event type;
- ``asyncapi.yaml``: an AsyncAPI 3.0 document: the NATS channels (subjects),
  which service sends and receives what, the message headers, the schemas.

``dralloc schemas export`` writes them; ``dralloc schemas export --check``
(and the test suite) fails when the checked-in files differ from the code.
Output is deterministic: the same code always gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import yaml

from dralloc.schemas import events as ev

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
ID_BASE = "https://dralloc.dev/schemas"

TOKEN_NOTE = (
    "A subject token, percent-encoded: '%', '.', '*', '>' and whitespace become %XX (gpu.nvidia.com -> gpu%2Envidia%2Ecom); decode with any URL-unquote."
)

# name: (address, parameters, messages, description)
CHANNELS: dict[str, tuple[str, list[str], list[type], str]] = {
    "inventorySlices": (
        "dra.inventory.{driver}.{pool}.{slice}",
        ["driver", "pool", "slice"],
        [ev.ResourceSlicePublished, ev.ResourceSliceRemoved],
        "Stream INVENTORY keeps the last message per subject: the current slice (or its removal).",
    ),
    "deviceClasses": (
        "dra.deviceclasses.{name}",
        ["name"],
        [ev.DeviceClassPublished, ev.DeviceClassRemoved],
        "Stream INVENTORY, last message per subject: the current DeviceClass.",
    ),
    "nodes": (
        "dra.nodes.{name}",
        ["name"],
        [ev.NodePublished, ev.NodeRemoved],
        "Stream INVENTORY, last message per subject: the node's labels.",
    ),
    "deviceTaintRules": (
        "dra.devicetaintrules.{name}",
        ["name"],
        [ev.DeviceTaintRulePublished, ev.DeviceTaintRuleRemoved],
        "Stream INVENTORY, last message per subject: the current DeviceTaintRule (taints the devices it selects).",
    ),
    "claims": (
        "dra.claims.{namespace}.{name}",
        ["namespace", "name"],
        [ev.ClaimSubmitted, ev.ClaimDeleted],
        "Stream CLAIMS: claims to allocate and their deletions.",
    ),
    "pods": (
        "dra.claims.{namespace}.{name}.pod",
        ["namespace", "name"],
        [ev.PodSubmitted, ev.PodDeleted],
        "Stream CLAIMS: Pods waiting for dralloc (scheduling gate dralloc.dev/allocate): their claims, allocated as one unit.",
    ),
    "evictionRefusals": (
        "dra.claims.{namespace}.{name}.evictrefused",
        ["namespace", "name"],
        [ev.EvictionRefused],
        "Stream CLAIMS: evictions the Kubernetes status writer could not carry out (a PodDisruptionBudget refused), for the allocator.",
    ),
    "allocations": (
        "dra.allocations.{namespace}.{name}",
        ["namespace", "name"],
        [ev.AllocationCommitted, ev.AllocationFailed, ev.AllocationReleased],
        "Stream ALLOCATIONS: every decision of the allocator, the only writer.",
    ),
    "evictions": (
        "dra.allocations.{namespace}.{name}.evict",
        ["namespace", "name"],
        [ev.EvictionRequested],
        "Stream ALLOCATIONS: evictions the allocator asks for (moves in a cluster), carried out by the Kubernetes status writer.",
    ),
}

# operation id: (action, channel, messages or None for all, summary)
OPERATIONS: dict[str, tuple[str, str, list[type] | None, str]] = {
    "discoveryPublishesSlices": ("send", "inventorySlices", None, "Node discovery publishes each node's ResourceSlices."),
    "discoveryPublishesNodes": ("send", "nodes", None, "Node discovery publishes each node's labels."),
    "ingestorPublishesClasses": ("send", "deviceClasses", None, "The ingestor publishes DeviceClasses from files or Kubernetes."),
    "ingestorPublishesClaims": ("send", "claims", None, "The ingestor (and `dralloc submit`) publishes claims; Pods' templates expanded."),
    "allocatorReceivesInventory": ("receive", "inventorySlices", None, "The allocator replays and follows the inventory."),
    "allocatorReceivesClasses": ("receive", "deviceClasses", None, "The allocator replays and follows the DeviceClasses."),
    "allocatorReceivesNodes": ("receive", "nodes", None, "The allocator replays and follows the nodes."),
    "ingestorPublishesTaintRules": ("send", "deviceTaintRules", None, "The ingestor publishes DeviceTaintRules from files or Kubernetes."),
    "allocatorReceivesTaintRules": ("receive", "deviceTaintRules", None, "The allocator replays and follows the DeviceTaintRules."),
    "ingestorPublishesPods": ("send", "pods", None, "The Kubernetes ingestor publishes each gated Pod's claims, and its deletion."),
    "allocatorReceivesPods": ("receive", "pods", None, "Durable consumer `allocator` (the CLAIMS stream): a Pod's claims allocated together."),
    "allocatorReceivesClaims": ("receive", "claims", None, "Durable consumer `allocator`; acked after the decision is stored."),
    "allocatorPublishesDecisions": ("send", "allocations", None, "Committed, failed (with the reason) and released allocations."),
    "statusWriterReceivesDecisions": ("receive", "allocations", None, "Durable consumer `statuswriter-<sink>`: local store or Kubernetes status."),
    "allocatorRequestsEvictions": ("send", "evictions", None, "With moves on: evict the Pods whose claims are in a waiting Pod's way."),
    "statusWriterReceivesEvictions": ("receive", "evictions", None, "The Kubernetes sink evicts each Pod (policy/v1 Eviction); the local store ignores it."),
    "statusWriterReportsEvictionRefusals": ("send", "evictionRefusals", None, "The Kubernetes sink tells the allocator an eviction was refused."),
    "allocatorReceivesEvictionRefusals": (
        "receive",
        "evictionRefusals",
        None,
        "Durable consumer `allocator`: the hold ends, the refusal explained, asked again after a backoff.",
    ),
}


def default_dir() -> Path:
    return Path(__file__).resolve().parent


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or cls.__name__).split())


def event_schema(cls: type) -> dict[str, Any]:
    schema = msgspec.json.schema(cls)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"{ID_BASE}/jsonschema/{cls.__name__}.json",
        "title": cls.__name__,
        "description": _doc(cls),
        **schema,
    }


def asyncapi() -> dict[str, Any]:
    schemas, components = msgspec.json.schema_components(ev.EVENT_TYPES, ref_template="#/components/schemas/{name}")
    del schemas  # each is a $ref into `components`
    messages = {
        cls.__name__: {
            "name": cls.__name__,
            "title": cls.__name__,
            "summary": _doc(cls),
            "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/MessageHeaders"},
            "payload": {"$ref": f"#/components/schemas/{cls.__name__}"},
        }
        for cls in ev.EVENT_TYPES
    }
    headers = {
        "type": "object",
        "description": "NATS headers on every event.",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": "Derived from the content's identity (claim uid + generation, slice name + generation): "
                "JetStream drops a retried publish within the duplicate window.",
            },
            "traceparent": {"type": "string", "description": "W3C trace context of the publishing span."},
            "tracestate": {"type": "string", "description": "W3C trace state, when present."},
        },
        "required": ["Nats-Msg-Id"],
    }
    channels: dict[str, Any] = {}
    for name, (address, params, types, description) in CHANNELS.items():
        channels[name] = {
            "address": address,
            "description": description,
            "parameters": {p: {"$ref": "#/components/parameters/token"} for p in params},
            "messages": {t.__name__: {"$ref": f"#/components/messages/{t.__name__}"} for t in types},
        }
    channels["deadLetters"] = {
        "address": "dra.deadletter.{stream}.{consumer}",
        "description": "Stream DEADLETTER: a message a consumer can never process, unchanged, with headers "
        "Dralloc-Reason, Dralloc-Subject (the original subject) and Dralloc-Sequence.",
        "parameters": {p: {"$ref": "#/components/parameters/token"} for p in ("stream", "consumer")},
    }
    operations: dict[str, Any] = {}
    for op_id, (action, channel, own, summary) in OPERATIONS.items():
        chosen = own or CHANNELS[channel][2]  # an operation's own messages, else all of its channel's
        operations[op_id] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": summary,
            "messages": [{"$ref": f"#/channels/{channel}/messages/{t.__name__}"} for t in chosen],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "dralloc bus",
            "version": f"{ev.SCHEMA_VERSION}.0.0",
            "description": "Kubernetes DRA (resource.k8s.io/v1) device allocation events over NATS JetStream. "
            "Every message is JSON with a `type` tag and a `schemaVersion`; resource objects inside are "
            "Kubernetes JSON. Generated from dralloc.schemas.events: do not edit.",
        },
        "defaultContentType": "application/json",
        "servers": {"local": {"host": "localhost:4222", "protocol": "nats", "description": "A nats-server with JetStream."}},
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "parameters": {"token": {"description": TOKEN_NOTE}},
            "schemas": {"MessageHeaders": headers, **components},
        },
    }


def render() -> dict[str, str]:
    """Relative path -> file content, for every generated file."""
    files = {f"jsonschema/{cls.__name__}.json": json.dumps(event_schema(cls), indent=2, sort_keys=True) + "\n" for cls in ev.EVENT_TYPES}
    header = "# Generated by `dralloc schemas export` from dralloc.schemas.events. Do not edit.\n"
    files["asyncapi.yaml"] = header + yaml.safe_dump(asyncapi(), sort_keys=False, width=100, allow_unicode=True)
    return files


def write(target: str | Path) -> list[Path]:
    """Write every generated file under `target`; remove stale event schemas; returns the paths written."""
    root = Path(target)
    files = render()
    written = []
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(path)
    for stale in (root / "jsonschema").glob("*.json"):
        if f"jsonschema/{stale.name}" not in files:
            stale.unlink()
    return written


def drift(target: str | Path) -> list[str]:
    """Generated files under `target` that are missing, different or stale (relative paths)."""
    root = Path(target)
    files = render()
    differ = [rel for rel, content in files.items() if not (root / rel).is_file() or (root / rel).read_text(encoding="utf-8") != content]
    stale = [f"jsonschema/{p.name}" for p in sorted((root / "jsonschema").glob("*.json")) if f"jsonschema/{p.name}" not in files]
    return differ + stale
