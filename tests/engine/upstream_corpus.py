"""The selectors and devices of ../shared/corpus/upstream-verdicts, for the CEL oracle tests."""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "upstream-verdicts"


def selectors_and_devices(corpus: Path = CORPUS) -> tuple[list[str], list[tuple[str, dict]]]:
    """Every distinct selector expression (sorted) and every distinct (driver, device) of the corpus
    (devices as plain YAML, camelCase keys, in the order first seen)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    expressions: set[str] = set()
    devices: dict[str, tuple[str, dict]] = {}
    for path in sorted(corpus.glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=loader):
            if not isinstance(doc, dict):
                continue
            _collect_expressions(doc, expressions)
            if doc.get("kind") == "ResourceSlice":
                driver = doc["spec"]["driver"]
                for dev in doc["spec"].get("devices") or []:
                    key = msgspec.json.encode([driver, dev]).decode()
                    devices.setdefault(key, (driver, dev))
    return sorted(expressions), list(devices.values())


def _collect_expressions(node: object, out: set[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expression" and isinstance(v, str):
                out.add(v)
            else:
                _collect_expressions(v, out)
    elif isinstance(node, list):
        for v in node:
            _collect_expressions(v, out)
