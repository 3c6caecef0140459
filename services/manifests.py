"""Reading manifests: YAML or JSON files and directories into typed objects.

One place turns user files into `dralloc.schemas.resource` objects, so that
`dralloc allocate`, `lint`, `submit` and the file ingestor report bad input
the same way: a `ManifestError` that names the file, the document and the
field. Reading goes on past a bad document; the caller decides whether any
error is fatal.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import msgspec.inspect as mi
import yaml

from dralloc.schemas.limits import MAX_NODES, json_problem, tree_problem
from dralloc.schemas.resource import API_VERSION, KINDS, Object, ObjectMeta

SUFFIXES = (".yaml", ".yml", ".json")

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster where PyYAML has it

OBJECT_META_FIELDS = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
        "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers", "managedFields",
    }
)  # fmt: skip
"""Kubernetes' ObjectMeta fields: what `metadata` may hold (dralloc reads only some of them)."""

UNKNOWN_SHOWN = 3
"""Unknown fields named in one error, at most (the count says how many more)."""

MAX_FILE_BYTES = 16 * 1024 * 1024
"""A manifest file larger than this is refused rather than parsed."""


def read_text(source: str | Path | BinaryIO) -> str:
    """A user's file (or an open binary stream: stdin) as text, refused past `MAX_FILE_BYTES`.

    Read up to one byte past the limit, not sized first: a device (``/dev/zero``), a pipe or a
    file still growing has no size to trust (stat says 0, or less than what follows), and reading
    all of it never ends. Raises OSError (a file past the limit: its message says so) or
    UnicodeDecodeError (not UTF-8). Line ends are read as `open` in text mode reads them (``\r\n``
    and ``\r`` as ``\n``: what `dralloc migrate` compares and writes back)."""
    if isinstance(source, str | Path):
        with open(source, "rb", buffering=0) as stream:
            data = _read_up_to_limit(stream)
    else:
        data = _read_up_to_limit(source)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    text = data.decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


_CHUNK = 1 << 16
"""Bytes `_read_up_to_limit` asks for at a time: a manifest is usually one read. (One `read` of the
whole limit allocates 16 MiB per file: ~20 us a claim file more than sizing it with stat first.)"""


def _read_up_to_limit(stream: BinaryIO) -> bytes:
    """The stream's bytes up to `MAX_FILE_BYTES` + 1 (one past: the caller refuses it)."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_FILE_BYTES:
        chunk = stream.read(min(_CHUNK, MAX_FILE_BYTES + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)  # (one chunk: that very bytes object)


def why_unreadable(exc: OSError | UnicodeDecodeError) -> str:
    """`read_text`'s failure in words: the system's reason ("No such file or directory"), else the
    exception's message ("larger than 16 MiB", the UTF-8 decode error)."""
    return getattr(exc, "strerror", None) or str(exc)


@dataclass(frozen=True, slots=True)
class Source:
    """Where an object came from: file and 1-based document index (0: the file as a whole, e.g. unreadable)."""

    path: str
    document: int

    def __str__(self) -> str:
        return f"{self.path} (document {self.document})" if self.document else self.path


@dataclass(frozen=True, slots=True)
class ManifestError:
    source: Source
    message: str
    what: str = ""
    """`Kind/name` of the object when known."""

    def __str__(self) -> str:
        where = f"{self.source}: {self.what}" if self.what else str(self.source)
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class Skipped:
    """A well-formed document of a kind the system does not read."""

    source: Source
    api_version: str
    kind: str
    name: str
    doc: Any = field(default=None, compare=False, repr=False)
    """The parsed document, for readers of more kinds (`dralloc.pods` expands workloads)."""

    def __str__(self) -> str:
        return f"{self.source}: skipped {self.api_version} {self.kind} {self.name!r}"


@dataclass(frozen=True, slots=True)
class Loaded:
    source: Source
    obj: Object


@dataclass(slots=True)
class Manifests:
    """The result of reading some inputs: objects in input order, plus what went wrong."""

    objects: list[Loaded]
    errors: list[ManifestError]
    skipped: list[Skipped]

    def of_type(self, cls: type) -> list[Any]:
        return [item.obj for item in self.objects if isinstance(item.obj, cls)]


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; directories as every manifest file below them, sorted by path."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()))
        else:
            files.append(path)
    return files


def decode_object(doc: Any, source: Source, *, within_limits: bool = False) -> Loaded | Skipped | ManifestError:
    """Turn one parsed document (builtins) into a typed object, or say why not. `within_limits`:
    the document is known to be within the structural limits (`parse_documents` says so of a JSON
    object it checked as text), so `tree_problem` need not walk it again."""
    if not isinstance(doc, dict):
        return ManifestError(source, f"expected a Kubernetes object (a mapping), got {type(doc).__name__}")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    name = (doc.get("metadata") or {}).get("name", "") if isinstance(doc.get("metadata"), dict) else ""
    what = f"{kind}/{name}" if kind else ""
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return ManifestError(source, "missing apiVersion or kind", what)
    if not within_limits and (problem := tree_problem(doc)) is not None:
        return ManifestError(source, problem, what)  # every kind, before msgspec (or any reader) recurses through it
    cls = KINDS.get((api_version, kind))
    if cls is None:
        known_kind = any(k == kind for _, k in KINDS)
        if known_kind:
            return ManifestError(source, f"apiVersion {api_version!r} is not supported for {kind}; use resource.k8s.io/v1", what)
        return Skipped(source, api_version, kind, str(name), doc)
    if api_version == API_VERSION and (unknown := unknown_fields(doc, cls)):
        return ManifestError(source, _unknown_message(unknown), what)
    try:
        obj = msgspec.convert(doc, cls)
    except msgspec.ValidationError as exc:
        return ManifestError(source, _field_message(exc), what)
    if not obj.metadata.name:
        return ManifestError(source, "metadata.name is required", what)
    return Loaded(source, obj)


def unknown_fields(doc: dict[str, Any], cls: type) -> list[str]:
    """The paths of the fields in `doc` that `cls` does not have, as kubectl's strict field
    validation (its default) refuses them: ``selector:`` for ``selectors:`` would otherwise be
    dropped in silence, and the claim match any device of its class; a field of a newer
    Kubernetes would be ignored as if it did not restrict anything. `metadata` is held to
    Kubernetes' ObjectMeta (dralloc reads only some of its fields); `status` is not looked at
    (what a cluster wrote, possibly a newer one; dralloc reads the allocation from it). Opaque
    driver parameters are the driver's, not looked into. Recursive: `doc` is within the
    structural limits (`tree_problem`), so at most `MAX_DEPTH` levels deep."""
    shape = _SHAPES.get(cls)
    if shape is None:
        made = _shape(mi.type_info(cls), {})
        assert made is not None and made[0] == _STRUCT
        shape = _SHAPES[cls] = (_STRUCT, {**made[1], "status": None})  # (any status: not judged)
    found: list[tuple[Any, ...]] = []
    _walk(doc, shape, (), found)
    return sorted("".join(f"[{part[0]}]" if isinstance(part, tuple) else f".{part}" for part in path)[1:] for path in found)


_STRUCT, _LIST, _MAP, _META = range(4)
_NOTHING: tuple[Any, ...] = ()

Shape = tuple[int, Any]
"""What a manifest's value may hold: (_STRUCT, {field: Shape | None}), (_LIST, item), (_MAP,
value), (_META, None) for ObjectMeta; None for a value with no fields below it (a string,
opaque parameters)."""


def _shape(info: Any, made: dict[type, Shape]) -> Shape | None:
    """The `Shape` of a msgspec type (`msgspec.inspect`), made once per kind (~4 ms a kind)."""
    if isinstance(info, mi.UnionType):  # (Optional: its one member with fields below it, if any)
        shapes = [shape for member in info.types if (shape := _shape(member, made)) is not None]
        return shapes[0] if shapes else None
    if isinstance(info, mi.StructType):
        if info.cls is ObjectMeta:
            return (_META, None)
        if info.cls in made:
            return made[info.cls]
        fields: dict[str, Shape | None] = {}
        shape = made[info.cls] = (_STRUCT, fields)
        for field in info.fields:
            fields[field.encode_name] = _shape(field.type, made)
        return shape
    if isinstance(info, mi.ListType):
        item = _shape(info.item_type, made)
        return (_LIST, item) if item is not None else None
    if isinstance(info, mi.DictType):
        value = _shape(info.value_type, made)
        return (_MAP, value) if value is not None else None
    return None


def _walk(value: Any, shape: Shape, path: tuple[Any, ...], found: list[tuple[Any, ...]]) -> None:
    kind, below = shape
    if kind == _STRUCT:
        if type(value) is dict:
            for key, item in value.items():
                child = below.get(key, _NOTHING)
                if child is _NOTHING:
                    found.append((*path, key))
                elif child is not None:
                    _walk(item, child, (*path, key), found)
    elif kind == _LIST:
        if type(value) is list:
            for i, item in enumerate(value):
                _walk(item, below, (*path, (i,)), found)
    elif kind == _MAP:
        if type(value) is dict:
            for key, item in value.items():
                _walk(item, below, (*path, (key,)), found)
    elif type(value) is dict:  # _META
        found += [(*path, key) for key in value if key not in OBJECT_META_FIELDS]


_SHAPES: dict[type, Shape] = {}


def _unknown_message(paths: list[str]) -> str:
    shown = ", ".join(f'"{path[:120]}"' for path in paths[:UNKNOWN_SHOWN])
    more = f" and {len(paths) - UNKNOWN_SHOWN} more" if len(paths) > UNKNOWN_SHOWN else ""
    return (
        f"unknown field{'s' if len(paths) > 1 else ''} {shown}{more}: not in resource.k8s.io/v1 as dralloc reads it (Kubernetes 1.37); "
        "a misspelt field, or a newer Kubernetes field dralloc does not support"
    )


def _field_message(exc: msgspec.ValidationError) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.spec.count`"; say it as a field path.
    text = str(exc)
    if " - at `$." in text:
        message, _, path = text.partition(" - at `$.")
        return f"field {path.rstrip('`')}: {message}"
    return text


def parse_documents(text: str, path: str) -> Iterator[tuple[Source, Any, bool] | ManifestError]:
    """Each document of a YAML (or JSON) text, with whether it is known to be within the
    structural limits (see `decode_object`), or one error where parsing stops.

    A ``.json`` file holding one JSON object is decoded by msgspec: PyYAML's constructor is
    pure Python (~0.6 ms a claim even with libyaml), and a program submitting thousands of claims
    a second writes JSON. Anything else, and JSON that does not decode, goes through the YAML
    parser as before (which then says what is wrong).

    Such a JSON object is within the limits `tree_problem` checks once `json_problem` passed its
    text (the same depth and integer limits, on the text) and the text is no longer than
    `MAX_NODES` characters (every value takes at least one; JSON has no aliases to expand): the
    submit path then skips that walk of every claim (~25 us a claim, a fifth of its own work)."""
    if path.endswith(".json") and (doc := _json_object(text)) is not None:
        yield Source(path, 1), doc, len(text) <= MAX_NODES
        return
    index = 0
    try:
        for index, doc in enumerate(yaml.load_all(text, Loader=_Loader), start=1):
            if doc is not None:
                yield Source(path, index), doc, False
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        yield ManifestError(Source(path, index + 1), f"invalid YAML{where}: {problem}")


def _json_object(text: str) -> dict[str, Any] | None:
    """The object a JSON text holds, or None: not one JSON object, or beyond the nesting and
    integer limits (`json_problem`: checked before decoding, as for every JSON dralloc reads)."""
    if not text.lstrip().startswith("{") or json_problem(text) is not None:
        return None
    try:
        doc = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def load_text(text: str, path: str = "<stdin>") -> Manifests:
    result = Manifests([], [], [])
    for item in parse_documents(text, path):
        if isinstance(item, ManifestError):
            result.errors.append(item)
            continue
        source, doc, within_limits = item
        decoded = decode_object(doc, source, within_limits=within_limits)
        if isinstance(decoded, Loaded):
            result.objects.append(decoded)
        elif isinstance(decoded, Skipped):
            result.skipped.append(decoded)
        else:
            result.errors.append(decoded)
    return result


def load_paths(paths: Iterable[str | Path]) -> Manifests:
    """Read every file (directories expanded) in order; errors are collected, never raised."""
    result = Manifests([], [], [])
    for file in expand_paths(paths):
        try:
            text = read_text(file)
        except (OSError, UnicodeDecodeError) as exc:
            result.errors.append(ManifestError(Source(str(file), 0), f"cannot read file: {why_unreadable(exc)}"))
            continue
        part = load_text(text, str(file))
        result.objects += part.objects
        result.errors += part.errors
        result.skipped += part.skipped
    return result
