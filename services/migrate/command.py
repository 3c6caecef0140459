"""`dralloc migrate`: read the inputs, rewrite every document, render yaml | diff | json.

Everything is read, decoded and rewritten before anything is printed or
written, so input that cannot be decoded (exit 2) leaves stdout empty and no
file touched. `run` returns what to print and write; the CLI prints it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from dralloc.manifests import SUFFIXES, read_text, why_unreadable
from dralloc.migrate import usage as usage_mod
from dralloc.migrate.documents import InputError, SourceFile, dump, kind_of, plain, read
from dralloc.migrate.rewrite import DecodeError, Names, Report, describe, migrate_object

OUTPUTS = ("yaml", "diff", "json")


@dataclass(slots=True)
class Result:
    stdout: str
    report: Report
    writes: dict[str, str] = field(default_factory=dict)
    """path -> new text (--in-place)."""

    @property
    def exit_code(self) -> int:
        return 1 if self.report.problems else 0


class _Written(NamedTuple):
    """A document written anew from its data: (data, indentation, the `---` line before it)."""

    data: object
    indent: tuple[int, int, int]
    marker: str


@dataclass(slots=True)
class _Migrated:
    source: SourceFile
    parts: list[str | _Written]
    """Output documents in order: an unchanged document's original text, or one written anew."""
    changed: bool


def files(paths: Sequence[str]) -> list[str]:
    """Files as given; directories as every *.yaml, *.yml, *.json below them, sorted; `-` is standard input."""
    out: list[str] = []
    for raw in paths:
        if raw == "-":
            out.append(raw)
            continue
        path = Path(raw)
        if path.is_dir():
            out.extend(str(p) for p in sorted(path.rglob("*")) if p.suffix in SUFFIXES and p.is_file())
        elif path.exists():
            out.append(raw)
        else:
            raise InputError(f"{raw}: no such file or directory")
    return out


def run(
    paths: Sequence[str],
    *,
    output: str = "yaml",
    in_place: bool = False,
    usage_path: str | None = None,
    keep_node_selectors: bool = False,
    stdin_text: str | None = None,
) -> Result:
    """Migrate the inputs. Raises InputError (exit 2) before any output when something cannot be decoded."""
    if output not in OUTPUTS:
        raise InputError(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}")
    if not paths:
        raise InputError("no input: give at least one -f FILE, directory, or - for standard input")
    names = files(paths)
    if in_place and "-" in names:
        raise InputError("--in-place rewrites files; standard input (-f -) has none")
    if names.count("-") > 1:
        raise InputError("-f - (standard input) can be given once")
    sources = [read(p, stdin_text) for p in names]
    usage = load_usage(usage_path) if usage_path is not None else None
    templates = Names()
    for source in sources:
        for doc in source.documents:
            _reserve_existing(doc.data, templates)
    report = Report()
    migrated = [_migrate_file(s, templates, report, usage, keep_node_selectors) for s in sources]
    result = Result("", report)
    if in_place:
        result.writes = {m.source.path: _text(m) for m in migrated if m.changed}
    elif output == "yaml":
        result.stdout = _join([_text(m) for m in migrated])
    elif output == "diff":
        result.stdout = "".join(_diff(m) for m in migrated if m.changed)
    else:
        documents = [plain(d) for m in migrated for d in _data(m)]
        value = documents[0] if len(documents) == 1 else {"apiVersion": "v1", "kind": "List", "items": documents}
        result.stdout = json.dumps(value, indent=2) + "\n"
    return result


def load_usage(path: str) -> usage_mod.Usage:
    """The --usage CSV read and parsed; InputError (exit 2) names the file and line."""
    where = f"--usage {path}"
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot read: {why_unreadable(exc)}") from None
    try:
        return usage_mod.parse(text, where)
    except usage_mod.UsageFileError as exc:
        raise InputError(str(exc)) from None


def _reserve_existing(data: object, names: Names) -> None:
    """Templates already in the inputs keep their names."""
    if not isinstance(data, Mapping):
        return
    items = data.get("items") if _is_list(data) else [data]
    for obj in items or []:
        if isinstance(obj, Mapping) and obj.get("kind") == "ResourceClaimTemplate" and isinstance(obj.get("metadata"), Mapping):
            meta = obj["metadata"]
            if isinstance(meta.get("name"), str):
                names.reserve(meta.get("namespace") if isinstance(meta.get("namespace"), str) else None, meta["name"])


def _is_list(data: Mapping) -> bool:
    kind = data.get("kind")
    return isinstance(kind, str) and kind.endswith("List") and isinstance(data.get("items"), list)


def _migrate_file(source: SourceFile, names: Names, report: Report, usage, keep: bool) -> _Migrated:
    parts: list[str | _Written] = []
    changed = False
    for doc in source.documents:
        where = f"{source.path} (document {doc.number})"
        data = doc.data
        if data is None:
            parts.append(doc.text)
            continue
        if not isinstance(data, MutableMapping):
            raise InputError(f"{where}: expected a Kubernetes object (a mapping), got {kind_of(data)}")
        try:
            if _is_list(data):
                made = _migrate_list(data, names, report, where, usage, keep)
                templates = []
            else:
                templates = migrate_object(data, names=names, report=report, where=where, usage=usage, keep_node_selectors=keep)
                made = bool(templates)
        except DecodeError as exc:
            raise InputError(f"{where}: {describe(data)}: {exc}") from None
        if not made:
            parts.append(doc.text)
            continue
        changed = True
        parts += [_Written(t, doc.indent, "") for t in templates]
        parts.append(_Written(data, doc.indent, doc.marker))
    return _Migrated(source, parts, changed)


def _migrate_list(data: MutableMapping, names: Names, report: Report, where: str, usage, keep: bool) -> bool:
    """Migrate a List's items; each item's templates go into the List right before it."""
    items = data["items"]
    made = False
    i = 0
    while i < len(items):
        item = items[i]
        if isinstance(item, MutableMapping):
            item_where = f"{where}: items[{i}]"
            try:
                templates = migrate_object(item, names=names, report=report, where=item_where, usage=usage, keep_node_selectors=keep)
            except DecodeError as exc:
                raise InputError(f"{item_where}: {describe(item)}: {exc}") from None
            for t in templates:
                items.insert(i, t)
                i += 1
            made = made or bool(templates)
        i += 1
    return made


def _data(m: _Migrated) -> list[object]:
    out = []
    for part in m.parts:
        if isinstance(part, _Written):
            out.append(part.data)
        else:
            doc = next(d for d in m.source.documents if d.text is part)
            if doc.data is not None:
                out.append(doc.data)
    return out


def _text(m: _Migrated) -> str:
    """The file's new text: unchanged when nothing changed (byte for byte)."""
    if not m.changed:
        return m.source.text
    if m.source.is_json:
        documents = _data(m)
        value = documents[0] if len(documents) == 1 else {"apiVersion": "v1", "kind": "List", "items": documents}
        return json.dumps(plain(value), indent=2) + "\n"
    pieces: list[str] = []
    for part in m.parts:
        if isinstance(part, _Written):
            pieces.append(part.marker + dump(part.data, part.indent))
        else:
            pieces.append(part)
    return _join(pieces)


def _join(texts: list[str]) -> str:
    """Documents one after another, each after the first starting on a `---` line."""
    out = ""
    for text in texts:
        if not text:
            continue
        if out:
            if not out.endswith("\n"):
                out += "\n"
            if not text.startswith("---"):
                out += "---\n"
        out += text
    return out


def _diff(m: _Migrated) -> str:
    old = m.source.text.splitlines(keepends=True)
    new = _text(m).splitlines(keepends=True)
    lines = list(difflib.unified_diff(old, new, fromfile=f"a/{m.source.path}", tofile=f"b/{m.source.path}"))
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


__all__ = ["InputError", "OUTPUTS", "Result", "run"]
