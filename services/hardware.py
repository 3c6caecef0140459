"""What real DRA drivers publish, and selectors checked against it (for `dralloc lint`).

A *representative fleet* is one simulated node of every hardware profile
(`dralloc discover --list-profiles`): H100/H200/A100/L40S GPUs, MIG
partitions, GB200 NVL72 trays and their NICs, published with the attributes
and capacities of NVIDIA's DRA driver (`gpu.nvidia.com`), DraNet (`dra.net`),
dralloc's own topology (`dralloc.dev`) and Kubernetes' standard ones
(`resource.kubernetes.io`). The catalog adds the few real attributes the
simulation does not publish (NVIDIA's `index`/`minor`, DraNet's MAC, MTU,
addresses, SR-IOV fields).

Three questions, each a pure function over that fleet:

- `unknown_references` (static tables, no fleet): attributes or capacities
  a selector names that no known driver publishes, with the closest real name and, where the name is
  published under another domain (`gpu.nvidia.com` -> `dralloc.dev` for
  `nvlink`), an expression that uses it;
- `selects`: how many devices of the fleet an expression matches, and
  which ones fail at run time (what the allocator would refuse);
- `most_per_node`: how many devices of a class one node offers at most.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from dralloc.allocator.engine.cel import CelError, DeviceEnv, compile_selector, device_env
from dralloc.allocator.engine.cel_diagnose import pretty
from dralloc.allocator.engine.cel_syntax import CelSyntaxError, Has, Ident, Index, Lit, Node, Select, children, map_children, parse
from dralloc.schemas.resource import Device, ResourceSlice

PUBLISHERS = {
    "gpu.nvidia.com": "NVIDIA's DRA driver",
    "dra.net": "DraNet",
    "dralloc.dev": "dralloc's discovery (topology, on GPUs and NICs)",
    "resource.kubernetes.io": "Kubernetes' standard attributes",
}

ATTRIBUTES: dict[str, dict[str, str]] = {
    "gpu.nvidia.com": {
        "architecture": "string",
        "brand": "string",
        "cudaComputeCapability": "version",
        "cudaDriverVersion": "version",
        "driverVersion": "version",
        "index": "int",
        "minor": "int",
        "parentUUID": "string",
        "productName": "string",
        "profile": "string",
        "type": "string",
        "uuid": "string",
    },
    "dra.net": {
        "alias": "string",
        "encapsulation": "string",
        "ifName": "string",
        "ipv4": "string",
        "mac": "string",
        "mtu": "int",
        "numaNode": "int",
        "pciAddress": "string",
        "pciDevice": "string",
        "pciVendor": "string",
        "rdma": "bool",
        "sriov": "bool",
        "sriovVfs": "int",
        "state": "string",
        "type": "string",
        "virtual": "bool",
    },
    "dralloc.dev": {
        "linkSpeedGbps": "int",
        "numaNode": "int",
        "nvlink": "bool",
        "nvlinkClique": "string",
        "nvlinkDomain": "string",
        "pcieSwitch": "string",
        "productName": "string",
    },
    "resource.kubernetes.io": {"pciBusID": "string", "pcieRoot": "string"},
}
"""domain -> attribute -> type: what the drivers of `PUBLISHERS` publish. Everything dralloc's
simulated fleet publishes (a test keeps the two in step), plus real attributes it does not
simulate (NVIDIA's index and minor; DraNet's MAC, MTU, addresses, SR-IOV fields)."""

CAPACITIES: dict[str, set[str]] = {
    "gpu.nvidia.com": {"copyEngines", "decoders", "encoders", "jpegEngines", "memory", "multiprocessors", "ofaEngines"},
}
"""domain -> capacity names."""

NVLINK_CONSTRAINT = "constraints: [{requests: [<request>], matchAttribute: dralloc.dev/nvlinkDomain}]"
"""What "NVLink-connected devices" means in resource.k8s.io/v1: one NVLink domain for all of them."""


@dataclass(frozen=True, slots=True)
class Catalog:
    attributes: dict[str, dict[str, str]]
    """domain -> attribute name -> type (int, bool, string, version, or a list type) the fleet publishes."""
    capacities: dict[str, set[str]]
    """domain -> capacity names the fleet publishes."""
    devices: tuple[tuple[str, str, Device], ...]
    """(node, driver, device) of the representative fleet."""
    envs: tuple[DeviceEnv, ...]
    """The CEL environment of each device (same order), built once."""


@functools.cache
def catalog() -> Catalog:
    """The representative fleet and the names its drivers publish (built once per process)."""
    from dralloc.discovery.profiles import PROFILES
    from dralloc.simulated import simulated_objects

    attributes: dict[str, dict[str, str]] = {}
    capacities: dict[str, set[str]] = {}
    devices: list[tuple[str, str, Device]] = []
    for obj in simulated_objects(sorted(PROFILES)):
        if not isinstance(obj, ResourceSlice):
            continue
        for device in obj.spec.devices:
            devices.append((device.node_name or obj.spec.node_name or "", obj.spec.driver, device))
            for key, value in device.attributes.items():
                domain, name = _split(key, obj.spec.driver)
                kind = next(f for f in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions") if getattr(value, f) is not None)
                attributes.setdefault(domain, {})[name] = kind
            for key in device.capacity:
                domain, name = _split(key, obj.spec.driver)
                capacities.setdefault(domain, set()).add(name)
    return Catalog(attributes, capacities, tuple(devices), tuple(device_env(driver, device) for _, driver, device in devices))


def _split(key: str, driver: str) -> tuple[str, str]:
    domain, sep, name = key.rpartition("/")
    return (domain, name) if sep else (driver, key)


@dataclass(frozen=True, slots=True)
class Reference:
    """`device.attributes[domain].name` (kind "attributes") or `device.capacity[domain].name`."""

    kind: str
    domain: str
    name: str


def references(expression: str) -> list[Reference]:
    """Every attribute or capacity the expression names with literal domain and name, in order."""
    try:
        ast = parse(expression)
    except (CelSyntaxError, RecursionError):
        return []
    found: list[Reference] = []

    def visit(node: Node) -> None:
        ref = _reference(node)
        if ref is not None and ref not in found:
            found.append(ref)
        for child in children(node):
            visit(child)

    visit(ast)
    return found


def domains(expression: str) -> set[str] | None:
    """Every domain the expression indexes `device.attributes` or `device.capacity` with
    (None when one is not a literal, or the expression does not parse)."""
    try:
        ast = parse(expression)
    except (CelSyntaxError, RecursionError):
        return None
    found: set[str] = set()
    stack = [ast]
    while stack:
        node = stack.pop()
        match node:
            case Index(Select(Ident("device"), "attributes" | "capacity"), index):
                if not (isinstance(index, Lit) and index.kind == "string"):
                    return None
                found.add(index.value)
            case Select(Ident("device"), "attributes" | "capacity"):
                pass  # reached only when not indexed by a literal (handled above)
        stack += children(node)
    return found


def _reference(node: Node) -> Reference | None:
    """The reference `node` makes: X.name, X['name'] or has(X.name), X = device.<kind>['domain']."""
    match node:
        case Select(Index(Select(Ident("device"), kind), Lit(domain, "string")), name) | Has(
            Index(Select(Ident("device"), kind), Lit(domain, "string")), name
        ) if kind in ("attributes", "capacity"):
            return Reference(kind, domain, name)
        case Index(Index(Select(Ident("device"), kind), Lit(domain, "string")), Lit(name, "string")) if kind in ("attributes", "capacity"):
            return Reference(kind, domain, name)
    return None


def _rewrite(node: Node, renames: dict[Reference, Reference]) -> Node:
    """`node` with each reference in `renames` replaced (same syntactic form)."""
    ref = _reference(node)
    if ref is not None and ref in renames:
        new = renames[ref]
        match node:
            case Select(Index(outer, _), _, optional):
                return Select(Index(outer, Lit(new.domain, "string")), new.name, optional)
            case Has(Index(outer, _), _):
                return Has(Index(outer, Lit(new.domain, "string")), new.name)
            case Index(Index(outer, _), _, optional):
                return Index(Index(outer, Lit(new.domain, "string")), Lit(new.name, "string"), optional)
    return map_children(node, lambda child: _rewrite(child, renames))


@dataclass(frozen=True, slots=True)
class Unknown:
    """A name no known driver publishes: what it is, the hint to print, and a replacement if one is certain."""

    reference: Reference
    hint: str
    replacement: Reference | None = None


def unknown_references(expression: str) -> list[Unknown]:
    """References to attributes or capacities that the drivers of `PUBLISHERS` do not publish.

    Only known domains are checked (another vendor's driver is not second-
    guessed), plus domains one typo away from a known one. The hint names
    the closest real name; `replacement` is set when the same name is
    published under exactly one other domain, or a single close spelling
    exists in the same domain.
    """
    out: list[Unknown] = []
    for ref in references(expression):
        table: Mapping[str, Collection[str]] = ATTRIBUTES if ref.kind == "attributes" else CAPACITIES
        if ref.domain not in table:
            close = difflib.get_close_matches(ref.domain, list(table), n=1, cutoff=0.85)
            if close:
                replacement = Reference(ref.kind, close[0], ref.name) if ref.name in table[close[0]] else None
                out.append(Unknown(ref, f"no driver publishes {ref.kind} under domain {ref.domain!r}: did you mean {close[0]!r}?", replacement))
            continue
        if ref.name in table[ref.domain]:
            continue
        elsewhere = sorted(d for d, names in table.items() if ref.name in names)
        publisher = PUBLISHERS.get(ref.domain, ref.domain)
        if len(elsewhere) == 1:
            replacement = Reference(ref.kind, elsewhere[0], ref.name)
            hint = f"{publisher} publishes no {ref.kind[:-1] if ref.kind == 'attributes' else ref.kind} {ref.name!r} under {ref.domain}; {PUBLISHERS.get(elsewhere[0], elsewhere[0])} publishes it as {elsewhere[0]}/{ref.name}"
            out.append(Unknown(ref, hint, replacement))
            continue
        candidates = sorted(table[ref.domain])
        close = difflib.get_close_matches(ref.name, candidates, n=3, cutoff=0.6)
        folded = [c for c in candidates if c.lower() == ref.name.lower()]
        replacement = Reference(ref.kind, ref.domain, (folded or close)[0]) if folded or len(close) == 1 else None
        what = "attribute" if ref.kind == "attributes" else "capacity"
        closest = f"; closest real name{'s' if len(close) > 1 else ''}: {', '.join(close)}" if close else f"; it publishes: {', '.join(candidates)}"
        out.append(Unknown(ref, f"{publisher} publishes no {what} {ref.name!r} under {ref.domain}{closest}", replacement))
    return out


def corrected(expression: str, unknown: Sequence[Unknown]) -> str | None:
    """The expression with every certain replacement made, or None when there is none."""
    renames = {u.reference: u.replacement for u in unknown if u.replacement is not None}
    if not renames:
        return None
    try:
        ast = parse(expression)
    except (CelSyntaxError, RecursionError):
        return None
    quote = "'" if expression.count("'") > expression.count('"') else '"'
    return pretty(_rewrite(ast, renames), quote)


def mentions_nvlink(expression: str) -> bool:
    """Whether a selector tests NVLink on each device (which cannot say that devices are connected to each other)."""
    return any("nvlink" in ref.name.lower() or "nvlink" in ref.domain.lower() for ref in references(expression))


@dataclass(frozen=True, slots=True)
class Selection:
    """How an expression fares on the representative fleet: devices matched, run-time failures."""

    matched: int
    candidates: int
    errors: tuple[str, ...] = ()

    @property
    def works(self) -> bool:
        """Compiles, selects at least one device, and fails on none: safe to suggest."""
        return self.matched > 0 and not self.errors


def selects(expression: str, within: Sequence[str] = ()) -> Selection | None:
    """Evaluate `expression` on every device of the fleet that also matches all of `within`
    (a class's selectors). None when an expression does not compile."""
    try:
        selector = compile_selector(expression)
        guards = [compile_selector(e) for e in within]
    except CelError:
        return None
    matched = candidates = 0
    errors: list[str] = []
    for env in catalog().envs:
        try:
            if not all(g.matches(env) for g in guards):
                continue
        except CelError:
            continue
        candidates += 1
        try:
            matched += bool(selector.matches(env))
        except CelError as exc:
            if len(errors) < 3:
                errors.append(str(exc))
    return Selection(matched, candidates, tuple(errors))


def most_per_node(selectors: Sequence[str]) -> tuple[int, str] | None:
    """The most devices one node of the fleet offers that match every selector, and that node
    (None when a selector does not compile)."""
    return _most_per_node(tuple(selectors))


@functools.lru_cache(maxsize=1024)  # lint asks once per request; many requests share their class
def _most_per_node(selectors: tuple[str, ...]) -> tuple[int, str] | None:
    try:
        compiled = [compile_selector(e) for e in selectors]
    except CelError:
        return None
    per_node: dict[str, int] = {}
    cat = catalog()
    for (node, _, _), env in zip(cat.devices, cat.envs):
        try:
            ok = all(s.matches(env) for s in compiled)
        except CelError:
            ok = False
        if ok:
            per_node[node] = per_node.get(node, 0) + 1
    if not per_node:
        return 0, ""
    node = max(sorted(per_node), key=lambda n: per_node[n])
    return per_node[node], node
