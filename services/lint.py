"""`dralloc lint`: check manifests without a running system.

Everything the API server and the allocator would refuse, found up front:
the schema (types, required fields), API validation (names, limits,
references inside an object), every CEL selector compiled against the
Kubernetes device environment (with a corrected expression where the
mistake is a known misuse), and references between objects (a claim's
DeviceClass, a Pod's ResourceClaimTemplate) among the given files.
"""

from __future__ import annotations

from dataclasses import dataclass

from dralloc.allocator.engine.cel import CelError, compile_selector, diagnose
from dralloc.manifests import Manifests
from dralloc.schemas.resource import (
    DeviceClass,
    DeviceSelector,
    Pod,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
)
from dralloc.schemas.validation import validate


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


def lint(manifests: Manifests) -> list[Problem]:
    """Every problem in the manifests, in input order."""
    problems = [Problem(str(e.source) + (f": {e.what}" if e.what else ""), "", e.message) for e in manifests.errors]
    classes = {c.metadata.name for c in manifests.of_type(DeviceClass)}
    templates = {(t.metadata.namespace or "default", t.metadata.name) for t in manifests.of_type(ResourceClaimTemplate)}
    for item in manifests.objects:
        obj = item.obj
        where = f"{item.source}: {obj.kind}/{obj.metadata.name}"
        problems += [Problem(where, error.field, error.message) for error in validate(obj)]
        problems += selector_problems(obj, where)
        spec = _claim_spec(obj)
        if spec is not None:
            for field, class_name in _class_references(spec, "spec.spec" if isinstance(obj, ResourceClaimTemplate) else "spec"):
                if class_name and class_name not in classes:
                    problems.append(
                        Problem(where, field, f"DeviceClass {class_name!r} is not defined in the given files (add the file that defines it with another -f)")
                    )
        if isinstance(obj, Pod):
            namespace = obj.metadata.namespace or "default"
            for i, ref in enumerate(obj.spec.resource_claims):
                name = ref.resource_claim_template_name
                if name and (namespace, name) not in templates:
                    problems.append(
                        Problem(
                            where,
                            f"spec.resourceClaims[{i}].resourceClaimTemplateName",
                            f"ResourceClaimTemplate {name!r} is not defined in the given files; the Pod cannot start without it",
                        )
                    )
    return problems


def selector_problems(obj: object, where: str) -> list[Problem]:
    """Every CEL selector of a DeviceClass, claim or template that cannot work, with its diagnosis."""
    return [problem for field, selector in _selectors(obj) for problem in _cel_problems(where, field, selector)]


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


def _selectors(obj: object) -> list[tuple[str, DeviceSelector]]:
    """(field path, selector) for every CEL selector the object holds."""
    if isinstance(obj, DeviceClass):
        return [(f"spec.selectors[{i}].cel.expression", s) for i, s in enumerate(obj.spec.selectors)]
    spec = _claim_spec(obj)
    if spec is None:
        return []
    path = "spec.spec" if isinstance(obj, ResourceClaimTemplate) else "spec"
    found = []
    for i, request in enumerate(spec.devices.requests):
        if request.exactly is not None:
            found += [(f"{path}.devices.requests[{i}].exactly.selectors[{k}].cel.expression", s) for k, s in enumerate(request.exactly.selectors)]
        for j, sub in enumerate(request.first_available):
            found += [
                (f"{path}.devices.requests[{i}].firstAvailable[{j}].selectors[{k}].cel.expression", s) for k, s in enumerate(sub.selectors)
            ]
    return found


def _cel_problems(where: str, field: str, selector: DeviceSelector) -> list[Problem]:
    if selector.cel is None:
        return []
    expression = selector.cel.expression
    hints = tuple(diagnose(expression))
    try:
        compile_selector(expression)
    except CelError as exc:
        # diagnose() restates the compile error first; the message already says it.
        hints = tuple(h for h in hints if not h.startswith("does not compile"))
        reason = str(exc).removeprefix(f"{expression}: ")
        return [Problem(where, field, f"invalid CEL: {reason}", hints)]
    if hints:
        # It compiles, but it cannot mean what it says in the v1 device environment.
        return [Problem(where, field, "this selector cannot match as written in resource.k8s.io/v1", hints)]
    return []
