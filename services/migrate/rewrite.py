"""One object's pod specs rewritten from extended resources to a ResourceClaimTemplate.

Pure (no I/O): `migrate_object` mutates the round-trip document it is given
(ruamel maps, so comments and key order of what stays are kept) and returns
the templates to place before it. What it cannot migrate it leaves as it was
and says why in the `Report`; input it cannot make sense of raises
`DecodeError` naming the field.

A rewritten pod spec (MIGRATE-CONTRACT.md, Output):
- each GPU container's extended resources leave `limits` and `requests` (an
  emptied map goes too) and the container gets `resources.claims` entries
  naming its own request, so two containers never share devices;
- an init container that runs to completion (not a `restartPolicy: Always`
  sidecar) reuses the smallest app-container request of the same kind with at
  least as many devices, as the device plugin hands its devices on; otherwise
  it gets its own request;
- the pod gets one `resourceClaims` entry, `gpu`, naming the object's template
  for this pod spec; requests use `gpu.nvidia.com` / `mig.nvidia.com` with
  `exactly.count` the old quantity, plus the CEL selectors of the GFD node
  labels (see `gfd`), which leave the pod unless kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from dralloc.migrate import gfd, resources
from dralloc.migrate.podspecs import Path, dotted, find_pod_specs, mappings, role
from dralloc.migrate.resources import GpuResource
from dralloc.migrate.usage import MARGIN, MIG_MODELS, Fit, Share, Usage, fit, share

POD_CLAIM = "gpu"
"""The pod's `resourceClaims` entry that its GPU containers reference."""
TEMPLATE_API = "resource.k8s.io/v1"
TIME_SLICING_CONFIG = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing"},
}
"""NVIDIA's DRA driver config for `nvidia.com/gpu.shared` (time-slicing): the claim's GPUs stay shareable
(`GpuConfig`, group `resource.nvidia.com/v1beta1`, `sharing.strategy` TimeSlicing or MPS: k8s-dra-driver-gpu
`api/nvidia.com/resource/v1beta1/gpuconfig.go`, `sharing.go`)."""
SHAREABLE = "device.allowMultipleAllocations"
"""A share's selector: only a multi-allocatable GPU (KEP-5075), never a whole one taken for a share."""

_AFFINITY_PATH = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


class DecodeError(ValueError):
    """A field the migration must read has the wrong shape; `path` says which."""

    def __init__(self, path: Path, message: str):
        super().__init__(f"field {dotted(path)}: {message}")
        self.path = path


@dataclass(slots=True)
class Report:
    """What a run says on stderr: problems (exit 1), warnings, and right-sizings with their reasons."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)


class Names:
    """Template names, unique per namespace over a whole run (and not taken by templates already in the inputs)."""

    def __init__(self) -> None:
        self._taken: set[tuple[str, str]] = set()

    def reserve(self, namespace: str | None, name: str) -> None:
        self._taken.add((namespace or "", name))

    def allocate(self, namespace: str | None, base: str) -> str:
        name, n = base, 1
        while (namespace or "", name) in self._taken:
            n += 1
            name = _dns(f"{base[:-4]}-{n}-gpu") if base.endswith("-gpu") else f"{base}-{n}"
        self.reserve(namespace, name)
        return name


def _dns(text: str, limit: int = 63) -> str:
    """A DNS label from any text; too long ones keep a hash of the whole so they stay distinct."""
    label = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if len(label) > limit:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        label = f"{label[: limit - 9].rstrip('-')}-{digest}"
    return label


def describe(obj: Mapping) -> str:
    """`Kind/name` of an object for messages (`?` where missing)."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return f"{obj.get('kind') or '?'}/{name if isinstance(name, str) else '?'}"


@dataclass(slots=True)
class _Ask:
    resource: GpuResource
    count: int
    fit: Fit | None = None
    share: Share | None = None
    share_first: bool = False
    """The share is tried first: no MIG slice fits (a slice, where one fits, comes first: it isolates
    memory and multiprocessors in hardware, where sharers time-slice the engines)."""
    request: str = ""


@dataclass(slots=True)
class _Container:
    path: Path
    body: MutableMapping
    init: bool
    sidecar: bool
    asks: list[_Ask]


def migrate_object(
    obj: MutableMapping, *, names: Names, report: Report, where: str, usage: Usage | None = None, keep_node_selectors: bool = False, whole_gpus: bool = False
) -> list[dict]:
    """Rewrite every pod spec of `obj` that asks for NVIDIA GPUs; the new templates, in order.

    `where` prefixes every message (file and document). `whole_gpus`: every GPU ask (MIG and
    shared ones too) becomes whole GPUs, as the device plugin hands them out (`dralloc plan`'s
    baseline); no right-sizing. Raises DecodeError."""
    what = f"{where}: {describe(obj)}"
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise DecodeError(("metadata",), "expected a mapping")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    if namespace is not None and not isinstance(namespace, str):
        raise DecodeError(("metadata", "namespace"), "expected a string")
    templates: list[dict] = []
    handled: set[int] = set()
    for path, spec in list(find_pod_specs(obj)):
        if not isinstance(spec, MutableMapping):  # documents are parsed into dicts; anything else cannot be rewritten
            raise DecodeError(path, "a pod spec that cannot be rewritten in place")
        handled.add(id(spec))
        label = role(obj, path)
        base = _dns(f"{name or 'pod'}-{label}-gpu" if label else f"{name or 'pod'}-gpu")
        template = _migrate_pod_spec(
            spec,
            path,
            namespace,
            base,
            obj_name=name or "",
            names=names,
            report=report,
            what=what,
            usage=usage,
            keep=keep_node_selectors,
            whole_gpus=whole_gpus,
        )
        if template is not None:
            templates.append(template)
    for path, mapping in mappings(obj, skip=frozenset(handled)):
        for kind in ("limits", "requests"):
            res = mapping.get("resources")
            amounts = res.get(kind) if isinstance(res, Mapping) else None
            if isinstance(amounts, Mapping) and any(isinstance(resources.classify(str(k)), GpuResource) for k in amounts):
                report.problems.append(
                    f"{what}: {dotted((*path, 'resources', kind))}: a GPU request outside a PodSpec (no `containers` list around it) is left in place"
                )
                break
    return templates


def _migrate_pod_spec(
    spec: MutableMapping,
    path: Path,
    namespace: str | None,
    base: str,
    *,
    obj_name: str,
    names: Names,
    report: Report,
    what: str,
    usage: Usage | None,
    keep: bool,
    whole_gpus: bool = False,
) -> dict | None:
    containers = _containers(spec, path, report, what)
    asking = [c for c in containers if c.asks]
    if not asking:
        return None
    claims = spec.get("resourceClaims")
    if claims or any(isinstance(c.body.get("resources"), Mapping) and c.body["resources"].get("claims") for c in containers):
        report.problems.append(f"{what}: {dotted(path)}: already mixes resourceClaims and GPU extended resources; left as it is")
        return None
    if whole_gpus:
        for c in asking:
            for ask in c.asks:
                ask.resource = GpuResource(ask.resource.name, "gpu")
    elif usage is not None:
        models = tuple(
            m
            for m in MIG_MODELS
            if all(
                gfd.admits(r, product=m.product_name, architecture=m.architecture, compute_major=int(m.compute_capability.split(".")[0]))
                for r in _gfd_requirements(spec, path)
            )
        )
        _right_size(asking, usage, namespace, obj_name, report, what, models)
    requests = _requests(asking)
    selectors = _node_selection(spec, path, {a.resource.kind == "mig" for c in asking for a in c.asks}, keep, report, what)
    for c in asking:
        _rewrite_container(c)
    spec["resourceClaims"] = [{"name": POD_CLAIM, "resourceClaimTemplateName": (template_name := names.allocate(namespace, base))}]
    body: list[dict] = []
    config: list[dict] = []
    for name, ask in requests:
        if ask.fit is not None or ask.share is not None:
            # right-sized: the MIG slice, the share, then the whole GPU it had where neither is free (so
            # the pod still runs everywhere it ran before: nodes without MIG or sharing, other models)
            options = []
            if ask.fit is not None:
                options.append(_device_request("mig", resources.MIG_CLASS, 1, [*selectors[True], ask.fit.selector()]))
            if ask.share is not None:
                portion = _device_request("share", resources.GPU_CLASS, 1, [*selectors[False], SHAREABLE])
                portion["capacity"] = {"requests": {"memory": ask.share.quantity()}}
                options.insert(0 if ask.share_first else len(options), portion)
            body.append({"name": name, "firstAvailable": [*options, _device_request("gpu", resources.GPU_CLASS, 1, selectors[False])]})
            continue
        expressions = list(selectors[ask.resource.kind == "mig"])
        if ask.resource.kind == "mig":
            expressions.append(f"device.attributes['gpu.nvidia.com'].profile == '{ask.resource.profile}'")
        exactly = _device_request(None, ask.resource.device_class, ask.count, expressions)
        body.append({"name": name, "exactly": exactly})
        if ask.resource.kind == "shared":
            config.append({"requests": [name], "opaque": {"driver": resources.GPU_CLASS, "parameters": dict(TIME_SLICING_CONFIG)}})
    devices: dict[str, Any] = {"requests": body}
    if config:
        devices["config"] = config
    metadata: dict[str, Any] = {"name": template_name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": TEMPLATE_API, "kind": "ResourceClaimTemplate", "metadata": metadata, "spec": {"spec": {"devices": devices}}}


def _device_request(name: str | None, device_class: str, count: int, expressions: list[str]) -> dict[str, Any]:
    """An `exactly` request, or a `firstAvailable` subrequest when named."""
    request: dict[str, Any] = {"name": name} if name else {}
    request.update({"deviceClassName": device_class, "count": count})
    if expressions:
        request["selectors"] = [{"cel": {"expression": e}} for e in expressions]
    return request


def _containers(spec: Mapping, path: Path, report: Report, what: str) -> list[_Container]:
    """The pod spec's containers with their GPU asks; containers that cannot be migrated have none (reported)."""
    found: list[_Container] = []
    inits = spec.get("initContainers")
    if inits is not None and not (isinstance(inits, list) and all(isinstance(c, Mapping) for c in inits)):
        raise DecodeError((*path, "initContainers"), "expected a list of containers")
    for key, items in (("initContainers", inits or []), ("containers", spec["containers"])):
        for i, body in enumerate(items):
            cpath = (*path, key, i)
            init = key == "initContainers"
            found.append(_Container(cpath, body, init, init and body.get("restartPolicy") == "Always", _asks(body, cpath, report, what)))
    return found


def _asks(container: Mapping, path: Path, report: Report, what: str) -> list[_Ask]:
    res = container.get("resources")
    if res is None:
        return []
    if not isinstance(res, Mapping):
        raise DecodeError((*path, "resources"), "expected a mapping")
    amounts: dict[str, dict[str, Any]] = {}
    for kind in ("limits", "requests"):
        value = res.get(kind)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise DecodeError((*path, "resources", kind), "expected a mapping of resource names to quantities")
        for key, quantity in value.items():
            amounts.setdefault(str(key), {})[kind] = quantity
    cname = container.get("name")
    asks: list[_Ask] = []
    unknown: list[str] = []
    for key, by_kind in amounts.items():
        cls = resources.classify(key)
        if cls == "other-gpu":
            report.warnings.append(f"{what}: container {cname!r}: {key} is not an NVIDIA GPU; left as it is")
        elif cls == "unknown-nvidia":
            unknown.append(key)
        elif isinstance(cls, GpuResource):
            counts = {}
            for kind, quantity in by_kind.items():
                n = resources.count(quantity)
                if n is None:
                    raise DecodeError((*path, "resources", kind, key), f"expected a whole number of devices, got {quantity!r}")
                counts[kind] = n
            if len(set(counts.values())) > 1:
                report.problems.append(
                    f"{what}: container {cname!r}: {key}: limits ({counts['limits']}) and requests ({counts['requests']}) "
                    "differ (Kubernetes requires them equal); container left as it is"
                )
                return []
            n = next(iter(counts.values()))
            if n:
                asks.append(_Ask(cls, n))
    if asks and unknown:
        report.problems.append(f"{what}: container {cname!r}: also asks for {', '.join(unknown)}, which has no DRA equivalent here; container left as it is")
        return []
    return asks


def _gfd_requirements(spec: Mapping, path: Path) -> list[gfd.Requirement]:
    """The GFD requirements every node the pod may run on satisfies (nodeSelector, a single required term)."""
    reqs = []
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        reqs += [gfd.Requirement(k, "In", (str(v),)) for k, v in selector.items() if gfd.is_gfd(k)]
    try:
        required = _dig(spec, _AFFINITY_PATH)
    except DecodeError:
        return reqs  # reported where the affinity is translated
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if isinstance(terms, list) and len(terms) == 1 and isinstance(terms[0], Mapping):
        expressions = terms[0].get("matchExpressions")
        for i, e in enumerate(expressions if isinstance(expressions, list) else []):
            try:
                req = _requirement(e, (*path, "affinity", i))
            except DecodeError:
                continue
            if gfd.is_gfd(req.key):
                reqs.append(req)
    return reqs


def _right_size(asking: list[_Container], usage: Usage, namespace: str | None, workload: str, report: Report, what: str, models: tuple = MIG_MODELS) -> None:
    """Move one-GPU app containers whose observed peak fits a MIG partition onto it (each change reported)."""
    for c in asking:
        if c.init or len(c.asks) != 1:
            continue
        ask = c.asks[0]
        if ask.resource.kind != "gpu":
            continue
        name = c.body.get("name")
        peak = usage.peak(namespace, workload, name) if isinstance(name, str) else None
        who = f"{what}: {dotted(c.path)} ({name})"
        if peak is None:
            continue  # nothing is right-sized without data
        if ask.count != 1:
            report.changes.append(f"{who}: kept {ask.count} whole GPUs (right-sizing moves one-GPU containers only)")
            continue
        answer = fit(peak, models)
        portion = share(peak)
        if isinstance(answer, str) and isinstance(portion, str):
            report.changes.append(f"{who}: kept a whole GPU: {answer}; no share: {portion}")
            continue
        steps: list[str] = []
        if not isinstance(answer, str):
            ask.resource = GpuResource(resources.GPU, "mig")
            ask.fit = answer
            steps.append(f"MIG {answer.describe()}")
        if not isinstance(portion, str):
            ask.share = portion
            ask.share_first = isinstance(answer, str)
            steps.insert(0 if ask.share_first else len(steps), f"a share of a GPU ({portion.quantity()} of its memory)")
        need = [x for x in (answer, portion) if not isinstance(x, str)][0]  # the MIG fit, else the share (not both str: above)
        report.changes.append(
            f"{who}: 1 GPU -> {', else '.join(steps)} (a whole GPU where none is free): peak {peak.memory_mib:g} MiB / "
            f"{peak.utilization:g}% fits {need.need_mib} MiB / {need.need_percent:g}% with {MARGIN:.0%} headroom"
            + (f"; no MIG: {answer}" if isinstance(answer, str) else "")
            + (f"; no share: {portion}" if isinstance(portion, str) else "")
        )


def _requests(asking: list[_Container]) -> list[tuple[str, _Ask]]:
    """Request names per ask: app containers and sidecars get their own, run-to-completion init containers reuse."""
    requests: list[tuple[str, _Ask]] = []
    used: set[str] = set()

    def own(c: _Container, ask: _Ask, first: bool) -> None:
        base = _dns(str(c.body.get("name")) if first else f"{c.body.get('name')}-{ask.resource.name.split('/')[-1]}")
        name, n = base, 1
        while name in used:
            n += 1
            name = _dns(f"{base}-{n}")
        used.add(name)
        ask.request = name
        requests.append((name, ask))

    apps = [c for c in asking if not c.init or c.sidecar]
    for c in apps:
        for i, ask in enumerate(c.asks):
            own(c, ask, i == 0)
    app_asks = [a for c in apps if not c.init for a in c.asks]  # app containers, not sidecars
    for c in asking:
        if c.init and not c.sidecar:
            for i, ask in enumerate(c.asks):
                donors = [a for a in app_asks if a.resource == ask.resource and a.fit is None and a.share is None and a.count >= ask.count]
                if donors:
                    ask.request = min(donors, key=lambda a: a.count).request
                else:
                    own(c, ask, i == 0)
    return requests


def _rewrite_container(c: _Container) -> None:
    res = c.body["resources"]
    for kind in ("limits", "requests"):
        amounts = res.get(kind)
        if not isinstance(amounts, MutableMapping):
            continue
        for ask in c.asks:
            if ask.fit is not None:
                amounts.pop(resources.GPU, None)
            else:
                amounts.pop(ask.resource.name, None)
        if not amounts:
            del res[kind]
    res["claims"] = [{"name": POD_CLAIM, "request": ask.request} for ask in c.asks]


def _node_selection(spec: MutableMapping, path: Path, kinds: set[bool], keep: bool, report: Report, what: str) -> dict[bool, list[str]]:
    """CEL selectors from the GFD labels of the pod's node selection, per request kind
    (False: whole GPU, True: MIG); translated labels leave the pod unless `keep`."""
    kinds = kinds | {False}
    out: dict[bool, list[str]] = {False: [], True: []}

    def translate(req: gfd.Requirement) -> dict[bool, str | None] | None:
        try:
            return {mig: gfd.to_cel(req, mig=mig) for mig in kinds}
        except gfd.Untranslatable as exc:
            report.warnings.append(f"{what}: {dotted(path)}: node label {req} kept on the pod: {exc}")
            return None

    selector = spec.get("nodeSelector")
    if selector is not None and not isinstance(selector, MutableMapping):
        raise DecodeError((*path, "nodeSelector"), "expected a mapping of labels")
    if selector is not None:
        for key in [k for k in selector if gfd.is_gfd(k)]:
            value = selector[key]
            cel = translate(gfd.Requirement(key, "In", (str(value),)))
            if cel is None:
                continue
            for mig, expression in cel.items():
                if expression:
                    out[mig].append(expression)
            if not keep:
                del selector[key]
        if not selector and not keep:
            del spec["nodeSelector"]

    required = _dig(spec, _AFFINITY_PATH)
    if required is None:
        return out
    apath = (*path, *_AFFINITY_PATH)
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list) or not all(isinstance(t, Mapping) for t in terms):
        raise DecodeError((*apath, "nodeSelectorTerms"), "expected a list of node selector terms")
    parsed = [
        [_requirement(e, (*apath, "nodeSelectorTerms", i, "matchExpressions", j)) for j, e in enumerate(_expressions(t, (*apath, "nodeSelectorTerms", i)))]
        for i, t in enumerate(terms)
    ]
    if len(terms) == 1:
        kept = []
        for expression, req in zip(terms[0].get("matchExpressions") or [], parsed[0]):
            cel = translate(req) if gfd.is_gfd(req.key) else None
            if cel is None:
                kept.append(expression)
                continue
            for mig, e in cel.items():
                if e:
                    out[mig].append(e)
        if not keep:
            _set_expressions(spec, terms[0], kept)
        return out
    gfd_only = all(all(gfd.is_gfd(r.key) for r in term) and not terms[i].get("matchFields") for i, term in enumerate(parsed))
    if not any(gfd.is_gfd(r.key) for term in parsed for r in term):
        return out
    if not gfd_only:
        report.warnings.append(f"{what}: {dotted(apath)}: several node selector terms mix GPU labels with others; kept on the pod, not translated")
        return out
    translated = [[translate(r) for r in term] for term in parsed]
    if any(c is None for term in translated for c in term):
        return out
    for mig in kinds:
        alternatives: list[str] = []
        for term in translated:
            parts = [text for c in term if c is not None and (text := c[mig])]  # (no c is None: returned above)
            if not parts:  # a term every GPU satisfies: the whole OR is true
                alternatives = []
                break
            alternatives.append(gfd.conjunction(parts))
        if alternatives:
            out[mig].append(" || ".join(f"({a})" for a in alternatives))
    if not keep:
        _drop_required(spec)
    return out


def _dig(obj: Mapping, keys: tuple[str, ...]) -> Any:
    node: Any = obj
    for depth, key in enumerate(keys):
        if node is None:
            return None
        if not isinstance(node, Mapping):
            raise DecodeError(keys[:depth], "expected a mapping")
        node = node.get(key)
    return node


def _expressions(term: Mapping, path: Path) -> list:
    expressions = term.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise DecodeError((*path, "matchExpressions"), "expected a list")
    return expressions


def _requirement(expression: Any, path: Path) -> gfd.Requirement:
    if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str) or not isinstance(expression.get("operator"), str):
        raise DecodeError(path, "expected {key, operator, values}")
    values = expression.get("values") or []
    if not isinstance(values, list):
        raise DecodeError((*path, "values"), "expected a list")
    return gfd.Requirement(expression["key"], expression["operator"], tuple(str(v) for v in values))


def _set_expressions(spec: MutableMapping, term: MutableMapping, kept: list) -> None:
    """Leave the one term with `kept` expressions; an emptied term takes the required affinity with it."""
    if kept:
        if len(kept) != len(term.get("matchExpressions") or []):
            term["matchExpressions"] = kept
        return
    if term.get("matchFields"):
        term.pop("matchExpressions", None)
        return
    _drop_required(spec)


def _drop_required(spec: MutableMapping) -> None:
    """Remove the required node affinity, and the maps it leaves empty."""
    affinity = spec["affinity"]
    node = affinity["nodeAffinity"]
    del node[_AFFINITY_PATH[2]]
    if not node:
        del affinity["nodeAffinity"]
    if not affinity:
        del spec["affinity"]
