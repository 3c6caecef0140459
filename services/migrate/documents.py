"""YAML/JSON text as documents that can be changed and written back as they were.

A file is split into its documents at `---` lines, so a document the
migration does not change is written back from its own text, byte for byte;
a changed one is dumped by ruamel.yaml's round-trip dumper (comments, key
order, quotes and the document's own indentation kept). JSON files are read
with the json module (one document) and written as YAML, or as JSON in place.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from dralloc.manifests import read_text, why_unreadable

MAX_NODES = 1_000_000
"""Values in one document counted with YAML aliases expanded (an alias bomb is refused, not walked)."""
MAX_DEPTH = 200
"""Nesting deeper than this is refused (no Kubernetes object comes close)."""

_MARKER = re.compile(r"^---(?:[ \t].*)?\r?\n?$")


class InputError(Exception):
    """Input that cannot be read or decoded (exit 2); the message names the file and document."""


@dataclass(slots=True)
class Document:
    number: int
    """1-based position among the file's documents (what messages say)."""
    text: str
    """The document's own text, its `---` line included."""
    data: Any
    marker: str
    """The `---` line it started with, or empty."""
    indent: tuple[int, int, int] = (2, 2, 0)
    """(mapping, sequence, offset) as ruamel's `YAML.indent` takes them."""


@dataclass(slots=True)
class SourceFile:
    path: str
    text: str
    documents: list[Document]
    is_json: bool = False


def read(path: str, stdin_text: str | None = None, *, fast: bool = False) -> SourceFile:
    """Read and parse one file (`-`: `stdin_text`); `fast`: see `parse`."""
    if path == "-":
        return parse(stdin_text or "", "<stdin>", fast=fast)
    file = Path(path)
    try:
        text = read_text(file)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {why_unreadable(exc)}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    return parse(text, path, is_json=file.suffix == ".json", fast=fast)


def parse(text: str, path: str, *, is_json: bool = False, fast: bool = False) -> SourceFile:
    """The documents of `text`; InputError names the file, document, line and column of bad YAML/JSON.

    `fast`: plain dicts and lists from ruamel's safe loader (its C parser, ~8x faster), for
    readers that never write the documents back (`dralloc plan`); no comments, no indentation."""
    if is_json:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
        _check_size(data, f"{path} (document 1)")
        return SourceFile(path, text, [Document(1, text, data, "")], is_json=True)
    documents: list[Document] = []
    line_offset = 0
    for chunk in _chunks(text):
        lines = chunk.splitlines(keepends=True)
        marker = lines[0] if lines and _MARKER.match(lines[0]) else ""
        number = len(documents) + 1
        data = _load(chunk, path, number, line_offset, fast)
        _check_size(data, f"{path} (document {number})")
        documents.append(Document(number, chunk, data, marker, _indent(chunk) if data is not None and not fast else (2, 2, 0)))
        line_offset += len(lines)
    return SourceFile(path, text, documents)


def _chunks(text: str) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if _MARKER.match(line) and current:
            chunks.append("".join(current))
            current = []
        current.append(line)
    if current:
        chunks.append("".join(current))
    return chunks


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold long CEL expressions or commands
    return yaml


def _load(chunk: str, path: str, number: int, line_offset: int, fast: bool = False) -> Any:
    try:
        return (YAML(typ="safe") if fast else _yaml()).load(chunk)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1 + line_offset}, column {mark.column + 1}" if mark else ""
        raise InputError(f"{path} (document {number}): invalid YAML{where}: {exc.problem or exc.context}") from None
    except YAMLError as exc:
        raise InputError(f"{path} (document {number}): invalid YAML: {exc}") from None
    except RecursionError:
        raise InputError(f"{path} (document {number}): nested deeper than {MAX_DEPTH} levels") from None


def _check_size(data: Any, where: str) -> None:
    """Refuse documents too deep or too large once aliases are expanded, before anything walks them."""
    stack = [(data, 0)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise InputError(f"{where}: more than {MAX_NODES} values (with YAML aliases expanded)")
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


_KEY_OPENS_BLOCK = re.compile(r"^(\s*)(?:- )?[^\s#][^:]*:\s*(?:#.*)?$")


def _indent(chunk: str) -> tuple[int, int, int]:
    """The document's (mapping, sequence, offset) indentation, from the first nested map and list."""
    mapping = offset = None
    lines = [(len(line) - len(line.lstrip(" ")), line.strip()) for line in chunk.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for (depth, text), (next_depth, next_text) in zip(lines, lines[1:]):
        if not _KEY_OPENS_BLOCK.match(" " * depth + text):
            continue
        parent = depth + 2 if text.startswith("- ") else depth
        if next_text.startswith("- "):
            if offset is None and next_depth >= parent:
                offset = next_depth - parent
        elif mapping is None and next_depth > parent:
            mapping = next_depth - parent
        if mapping is not None and offset is not None:
            break
    mapping = mapping or 2
    offset = offset or 0
    return (mapping, offset + 2, offset)


def dump(data: Any, indent: tuple[int, int, int] = (2, 2, 0)) -> str:
    """One document as YAML, round-trip (comments and key order kept)."""
    yaml = _yaml()
    yaml.indent(mapping=indent[0], sequence=indent[1], offset=indent[2])
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def plain(data: Any) -> Any:
    """Round-trip objects as JSON-ready builtins (ruamel's booleans are ints underneath)."""
    if isinstance(data, ScalarBoolean):
        return bool(data)
    if isinstance(data, dict):
        return {str(k): plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [plain(v) for v in data]
    if isinstance(data, (str, int, float, bool)) or data is None:
        return data
    return str(data)  # timestamps and other tagged scalars: as YAML wrote them


def kind_of(data: Any) -> str:
    """What a YAML value is, in YAML's words (for messages)."""
    if isinstance(data, list):
        return "a list"
    if isinstance(data, dict):
        return "a mapping"
    return f"a scalar ({str(data)[:40]!r})"
