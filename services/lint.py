"""`dralloc lint`: check manifests without a running system.

Everything the API server and the allocator would refuse, found up front:
the schema (types, required fields), API validation (names, limits,
references inside an object), every CEL selector compiled against the
Kubernetes device environment (with a corrected expression where the
mistake is a known misuse), and references between objects (a claim's
DeviceClass, a Pod's ResourceClaimTemplate) among the given files.

`lint` also knows the hardware (dralloc.hardware): attributes and
capacities a selector names are checked against what real drivers publish
(closest real name for an unknown one), a corrected expression is offered
only when it compiles and selects devices on a representative fleet without
run-time errors, NVLink between devices is pointed to the `matchAttribute`
constraint, and the engine's limits (32 devices per claim) and the fleet's
shape (most devices of a class on one node) are checked. Pods and the
workload kinds that embed pod templates are read too (dralloc.pods).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from dralloc import hardware
from dralloc.allocator.engine.cel import CelError, compile_selector, diagnose, shown
from dralloc.manifests import Manifests
from dralloc.pods import PodError, class_for_extended_resources, is_dra_extended_resource_name, is_workload, workload_pods
from dralloc.schemas.resource import (
    DeviceClass,
    DeviceSelector,
    Pod,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
)
from dralloc.schemas.validation import ALLOCATION_RESULTS_MAX, validate

SUGGESTED = "suggested expression: "
MAX_SHOWN = 200
"""Longer expressions are cut in messages (the field path says where the whole one is)."""


@dataclass(frozen=True, slots=True)
class Problem:
    where: str
    """File and document, then `Kind/name`."""
    field: str
    message: str
    hints: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {"where": self.where, "field": self.field, "message": self.message, "hints": list(self.hints)}

    def __str__(self) -> str:
        head = f"{self.where}: {self.field}: {self.message}" if self.field else f"{self.where}: {self.message}"
        return "\n".join([head, *(f"    {hint}" for hint in self.hints)])


def lint(manifests: Manifests, *, hardware: bool = True) -> list[Problem]:
    """Every problem in the manifests, in input order; `hardware`: also check selectors, suggestions
    and counts against a representative fleet (dralloc.hardware)."""
    problems = [Problem(str(e.source) + (f": {e.what}" if e.what else ""), "", e.message) for e in manifests.errors]
    class_objects = {c.metadata.name: c for c in manifests.of_type(DeviceClass)}
    classes = set(class_objects)
    templates = {(t.metadata.namespace or "default", t.metadata.name) for t in manifests.of_type(ResourceClaimTemplate)}
    for where, obj, prefix in _objects(manifests, problems):
        if not prefix:
            problems += [Problem(where, error.field, error.message) for error in validate(obj)]
            problems += _selector_checks(obj, where, class_objects, hardware)
        spec = _claim_spec(obj)
        if spec is not None:
            path = "spec.spec" if isinstance(obj, ResourceClaimTemplate) else "spec"
            for field, class_name in _class_references(spec, path):
                if class_name and class_name not in classes:
                    problems.append(
                        Problem(where, field, f"DeviceClass {class_name!r} is not defined in the given files (add the file that defines it with another -f)")
                    )
            problems += _count_problems(spec, path, where, class_objects, hardware)
        if isinstance(obj, Pod):
            namespace = obj.metadata.namespace or "default"
            for i, ref in enumerate(obj.spec.resource_claims):
                name = ref.resource_claim_template_name
                if name and (namespace, name) not in templates:
                    problems.append(
                        Problem(
                            where,
                            f"{prefix}spec.resourceClaims[{i}].resourceClaimTemplateName",
                            f"ResourceClaimTemplate {name!r} is not defined in the given files; the Pod cannot start without it",
                        )
                    )
            problems += _extended_resource_problems(obj, where, prefix, class_objects)
    return problems


def _objects(manifests: Manifests, problems: list[Problem]) -> Iterator[tuple[str, object, str]]:
    """(where, object, field prefix) for every object, and one Pod per workload (its template's
    fields are named from the workload: prefix `spec.template.`)."""
    from dralloc.pods import WORKLOAD_KINDS

    for item in manifests.objects:
        yield f"{item.source}: {item.obj.kind}/{item.obj.metadata.name}", item.obj, ""
    for skipped in manifests.skipped:
        if not is_workload(skipped.doc):
            continue
        where = f"{skipped.source}: {skipped.kind}/{skipped.name}"
        try:
            pods = workload_pods(skipped.doc)
        except PodError as exc:
            problems.append(Problem(where, "", str(exc)))
            continue
        prefix = ".".join(WORKLOAD_KINDS[(skipped.api_version, skipped.kind)]) + "."
        for pod in pods[:1]:  # the replicas share one template: check it once
            yield where, pod, prefix


def workload_count(manifests: Manifests) -> int:
    """How many workload documents (other than Pods) the manifests hold: lint checks them too."""
    return sum(1 for s in manifests.skipped if is_workload(s.doc))


def lint_warnings(manifests: Manifests, paths: Sequence[str] = ()) -> list[str]:
    """What lint did not check: skipped kinds, and no object at all (an empty input is never silently clean)."""
    warnings = [str(s) for s in manifests.skipped if not is_workload(s.doc)]
    if not manifests.objects and not manifests.errors and not workload_count(manifests):
        where = ", ".join(map(str, paths)) or "the input"
        warnings.append(f"{where}: no Kubernetes object found (nothing was checked)")
    return warnings


def cut(expression: str, limit: int = MAX_SHOWN) -> str:
    """An expression as shown in a message: whole when short, else its start and its length."""
    if len(expression) <= limit:
        return expression
    return f"{expression[:limit]}... ({len(expression)} characters)"


def selector_problems(obj: object, where: str) -> list[Problem]:
    """Every CEL selector of a DeviceClass, claim or template that cannot work, with its diagnosis
    (the CEL environment alone: what the ingestor reports when it publishes)."""
    return [problem for field, selector, _ in _selectors(obj) for problem in _cel_problems(where, field, selector)]


def _selector_checks(obj: object, where: str, classes: Mapping[str, DeviceClass], with_hardware: bool) -> list[Problem]:
    """`selector_problems`, and `with_hardware` every selector checked against a representative fleet."""
    problems: list[Problem] = []
    for field, selector, class_name in _selectors(obj):
        found = _cel_problems(where, field, selector)
        if with_hardware and selector.cel is not None:
            within = _class_selectors(classes.get(class_name)) if class_name else ()
            found = _hardware_problems(where, field, selector.cel.expression, found, within, is_class=isinstance(obj, DeviceClass))
        problems += found
    return problems


def _class_selectors(cls: DeviceClass | None) -> tuple[str, ...]:
    if cls is None:
        return ()
    return tuple(s.cel.expression for s in cls.spec.selectors if s.cel is not None)


def _hardware_problems(where: str, field: str, expression: str, found: list[Problem], within: Sequence[str], *, is_class: bool) -> list[Problem]:
    """Re-judge one selector on a representative fleet (one node of each hardware profile).

    A suggested expression is kept only when it selects devices there without
    run-time errors (within the request's class, when the class is known);
    otherwise the hint says why there is none. A DeviceClass selector that
    compiles cleanly is a problem when it fails at run time on the fleet's
    devices (a class sees every device).
    """
    if not found:
        if not (is_class and _known_domains_only(expression)):
            return []
        selection = hardware.selects(expression)
        if selection is None or not selection.errors:
            return []
        runtime_hints = (
            f"for example: {cut(selection.errors[0], 2 * MAX_SHOWN)}",
            "test the driver first: device.driver == '<driver>' && ... (CEL's && skips the rest when the left side is false)",
        )
        return [Problem(where, field, "fails at run time on devices of other drivers (a DeviceClass sees every device)", runtime_hints)]
    out = []
    for problem in found:
        hints = [h for h in problem.hints if not h.startswith(SUGGESTED)]
        suggestion = next((h.removeprefix(SUGGESTED) for h in problem.hints if h.startswith(SUGGESTED)), None)
        if suggestion is not None and not suggestion.endswith(" characters)"):
            selection = hardware.selects(suggestion, within)
            if selection is not None and selection.matched > 0 and (not selection.errors or (not is_class and not within)):
                hints.append(f"{SUGGESTED}{suggestion}")
                hints.append(f"(it selects {selection.matched} of {selection.candidates} devices on a representative fleet: one node of each hardware profile)")
            elif selection is None:
                hints.append("no corrected expression: the correction does not compile either")
            elif selection.matched == 0:
                hints.append("no corrected expression: the correction selects no device on a representative fleet")
            else:
                hints.append(f"no corrected expression: the correction fails at run time ({cut(selection.errors[0])})")
        elif suggestion is not None:
            hints.append(f"{SUGGESTED}{suggestion}")
        out.append(Problem(problem.where, problem.field, problem.message, tuple(hints)))
    return out


def _known_domains_only(expression: str) -> bool:
    found = hardware.domains(expression)
    if not found:
        return False
    return all(d in hardware.PUBLISHERS for d in found)


def _count_problems(spec: ResourceClaimSpec, path: str, where: str, classes: Mapping[str, DeviceClass], with_hardware: bool) -> list[Problem]:
    """What the engine refuses (more than 32 devices in one claim) and, `with_hardware`, an ExactCount
    request larger than any node of the representative fleet offers."""
    problems: list[Problem] = []
    total = 0
    for i, request in enumerate(spec.devices.requests):
        options = (
            [("exactly", request.exactly)] if request.exactly is not None else [(f"firstAvailable[{j}]", sub) for j, sub in enumerate(request.first_available)]
        )
        counts = [(f"{path}.devices.requests[{i}].{name}.count", o.count or 1) for name, o in options if (o.allocation_mode or "ExactCount") == "ExactCount"]
        if len(counts) < len(options) or not counts:
            continue  # allocationMode All: as many as there are
        field, count = min(counts, key=lambda c: c[1])  # the smallest alternative is the least it asks for
        total += count
        exact = request.exactly
        if count > ALLOCATION_RESULTS_MAX:
            problems.append(
                Problem(
                    where,
                    field,
                    f"asks for {count} devices; a claim holds at most {ALLOCATION_RESULTS_MAX} (the allocator refuses it): split it into several claims or a gang",
                )
            )
            continue
        if with_hardware and exact is not None and exact.device_class_name in classes:
            selectors = [*_class_selectors(classes[exact.device_class_name]), *(s.cel.expression for s in exact.selectors if s.cel is not None)]
            most = hardware.most_per_node(selectors)
            if most is not None and 0 < most[0] < count:
                problems.append(
                    Problem(
                        where,
                        field,
                        f"asks for {count} devices on one node; no node of a representative fleet has more than {most[0]} that match (e.g. {most[1]})",
                        ("split the claim, or ask for the devices in several claims of one gang (dralloc submit --gang)",),
                    )
                )
    if total > ALLOCATION_RESULTS_MAX and not any(p.message.startswith("asks for") for p in problems):
        problems.append(
            Problem(where, f"{path}.devices.requests", f"its requests ask for {total} devices together; a claim holds at most {ALLOCATION_RESULTS_MAX}")
        )
    return problems


def _extended_resource_problems(pod: Pod, where: str, prefix: str, classes: Mapping[str, DeviceClass]) -> list[Problem]:
    """Container extended resources no DeviceClass in the files maps (without a device plugin the Pod cannot start)."""
    if not classes:
        return []
    mapping = class_for_extended_resources(list(classes.values()))
    problems = []
    containers = [("initContainers", c) for c in pod.spec.init_containers] + [("containers", c) for c in pod.spec.containers]
    index = {"initContainers": 0, "containers": 0}
    for kind, container in containers:
        i = index[kind]
        index[kind] += 1
        for name in sorted({**container.resources.limits, **container.resources.requests}):
            if is_dra_extended_resource_name(name) and name not in mapping and name.startswith("deviceclass.resource.kubernetes.io/"):
                problems.append(Problem(where, f"{prefix}spec.{kind}[{i}].resources", f"{name}: no DeviceClass {name.split('/', 1)[1]!r} in the given files"))
    return problems


def _claim_spec(obj: object) -> ResourceClaimSpec | None:
    if isinstance(obj, ResourceClaim):
        return obj.spec
    if isinstance(obj, ResourceClaimTemplate):
        return obj.spec.spec
    return None


def _class_references(spec: ResourceClaimSpec, path: str) -> list[tuple[str, str]]:
    refs = []
    for i, request in enumerate(spec.devices.requests):
        if request.exactly is not None:
            refs.append((f"{path}.devices.requests[{i}].exactly.deviceClassName", request.exactly.device_class_name))
        for j, sub in enumerate(request.first_available):
            refs.append((f"{path}.devices.requests[{i}].firstAvailable[{j}].deviceClassName", sub.device_class_name))
    return refs


def _selectors(obj: object) -> list[tuple[str, DeviceSelector, str | None]]:
    """(field path, selector, the request's DeviceClass or None for a class's own) for every CEL selector the object holds."""
    if isinstance(obj, DeviceClass):
        return [(f"spec.selectors[{i}].cel.expression", s, None) for i, s in enumerate(obj.spec.selectors)]
    spec = _claim_spec(obj)
    if spec is None:
        return []
    path = "spec.spec" if isinstance(obj, ResourceClaimTemplate) else "spec"
    found: list[tuple[str, DeviceSelector, str | None]] = []
    for i, request in enumerate(spec.devices.requests):
        if request.exactly is not None:
            found += [
                (f"{path}.devices.requests[{i}].exactly.selectors[{k}].cel.expression", s, request.exactly.device_class_name)
                for k, s in enumerate(request.exactly.selectors)
            ]
        for j, sub in enumerate(request.first_available):
            found += [
                (f"{path}.devices.requests[{i}].firstAvailable[{j}].selectors[{k}].cel.expression", s, sub.device_class_name)
                for k, s in enumerate(sub.selectors)
            ]
    return found


def _cel_problems(where: str, field: str, selector: DeviceSelector) -> list[Problem]:
    """The CEL diagnosis of one selector, with the names real drivers publish (dralloc.hardware's
    tables: no fleet needed, so the ingestor reports the same): unknown names get the closest real
    one, the suggestion uses the right domain, NVLink points to the constraint."""
    if selector.cel is None:
        return []
    found = _diagnosis(selector.cel.expression)
    return [] if found is None else [Problem(where, field, *found)]


@functools.lru_cache(maxsize=1024)
def _diagnosis(expression: str) -> tuple[str, tuple[str, ...]] | None:
    """`_cel_problems`'s message and hints for an expression, None when it has no problem.

    Cached: a workload sends the same few selectors with every claim, and the submit path and the
    ingestor lint each claim (parsing and diagnosing a selector is most of their CPU per claim).
    Bounded, as the input is hostile: 1,024 expressions of at most the API's 10 KiB each."""
    hints = list(diagnose(expression))
    message = ""
    try:
        compile_selector(expression)
    except CelError as exc:
        # diagnose() restates the compile error first; the message already says it.
        hints = [h for h in hints if not h.startswith("does not compile")]
        message = f"invalid CEL: {cut(str(exc).removeprefix(f'{shown(expression)}: '), 2 * MAX_SHOWN)}"
    suggestion = next((h.removeprefix(SUGGESTED) for h in hints if h.startswith(SUGGESTED)), None)
    hints = [h for h in hints if not h.startswith(SUGGESTED)]
    target = suggestion if suggestion is not None else (None if message else expression)
    unknown = hardware.unknown_references(target) if target is not None else []
    hints += [u.hint for u in unknown]
    candidate = hardware.corrected(target, unknown) if target is not None else None
    if candidate is not None and not _compiles(candidate):
        candidate = None
    candidate = candidate or suggestion
    if (message or hints) and (hardware.mentions_nvlink(expression) or (target is not None and hardware.mentions_nvlink(target))):
        hints.append(
            "NVLink between the devices of a claim is a constraint, not a device attribute: "
            f"{hardware.NVLINK_CONSTRAINT} in the claim or its ResourceClaimTemplate "
            "(a DeviceClass cannot carry constraints); dralloc.dev/nvlink only says that a GPU has NVLink"
        )
    if not message and unknown:
        message = "names attributes or capacities no driver publishes: allocation fails with 'no such key' on every device it reaches"
    elif not message and hints:
        # It compiles, but it cannot mean what it says in the v1 device environment.
        message = "this selector cannot match as written in resource.k8s.io/v1"
    if not message:
        return None
    if candidate is not None:
        hints.append(f"{SUGGESTED}{cut(candidate, 2 * MAX_SHOWN)}")
    return message, tuple(dict.fromkeys(hints))


def _compiles(expression: str) -> bool:
    try:
        compile_selector(expression)
    except CelError:
        return False
    return True
