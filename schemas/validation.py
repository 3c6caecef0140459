"""API validation of resource.k8s.io/v1 objects, as the Kubernetes API server does it.

A manifest that the API server would reject is rejected here too, with the
field path Kubernetes would name. CEL expressions are only checked for length
here; compiling them against the device environment is the engine's job
(`dralloc.allocator.engine.cel`), and `dralloc lint` does both.

Pure functions: an object in, a list of `FieldError` out (empty when valid).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import (
    Counter,
    DeviceAttribute,
    DeviceCapacity,
    DeviceClass,
    DeviceSelector,
    DeviceTaintRule,
    DeviceToleration,
    Node,
    NodeAllocatableResource,
    Pod,
    Quantity,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
    ResourceSlice,
)

# Limits from k8s.io/api/resource/v1 (types.go constants).
REQUESTS_MAX = 32  # DeviceRequestsMaxSize
SUBREQUESTS_MAX = 8  # FirstAvailableDeviceRequestMaxSize
CONSTRAINTS_MAX = 32  # DeviceConstraintsMaxSize
CONFIG_MAX = 32  # DeviceConfigMaxSize
SELECTORS_MAX = 32  # DeviceSelectorsMaxSize
TOLERATIONS_MAX = 16  # DeviceTolerationsMaxLength
ALLOCATION_RESULTS_MAX = 32  # AllocationResultsMaxSize: devices per claim
CEL_EXPRESSION_MAX_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength
SLICE_DEVICES_MAX = 128  # ResourceSliceMaxDevices
SLICE_DEVICES_WITH_COUNTERS_MAX = 64  # ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
ATTRIBUTES_AND_CAPACITY_MAX = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
SHARED_COUNTERS_MAX = 8  # ResourceSliceMaxCounterSets (1.35)
COUNTERS_PER_SET_MAX = 32  # ResourceSliceMaxCountersPerCounterSet
CONSUMPTIONS_PER_DEVICE_MAX = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
COUNTERS_PER_CONSUMPTION_MAX = 32  # ResourceSliceMaxCountersPerDeviceCounterConsumption
COMPATIBILITY_GROUPS_MAX = 2  # a consumption's compatibilityGroups (1.37 alpha; not allocated from: inventory.py)
ATTRIBUTE_VALUES_MAX = 48  # ResourceSliceMaxAttributeValuesPerDevice: scalar and list entries together
ATTRIBUTE_VALUE_MAX_BYTES = 64  # DeviceAttributeMaxValueLength: a string or version (each list entry too)
SKIP_NODE_OPERATIONS = ("*", "NodePrepareResources", "NodeUnprepareResources")  # SkipNodeOperation (1.37 alpha)
_ATTRIBUTE_FIELDS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
"""A DNS subdomain (`is_dns_subdomain`), its length too: one C call for a caller that checks a
name per claim (the engine's planner). Ends at ``\\Z``, not ``$``: ``$`` also matches before a final
newline."""
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str) -> bool:
    return DNS_SUBDOMAIN.match(value) is not None


def qualified_name_error(value: str) -> str | None:
    """A DRA attribute/capacity name: `identifier` or `domain/identifier` (max 32 chars after the domain)."""
    domain, sep, name = value.rpartition("/")
    if sep and not is_dns_subdomain(domain):
        return f"{domain!r} is not a DNS subdomain"
    if not _C_IDENTIFIER.match(name) or len(name) > 32:
        return f"{name!r} must be a C identifier of at most 32 characters"
    return None


def fully_qualified_name_error(value: str) -> str | None:
    """Constraints name attributes with their domain: `domain/identifier`."""
    if "/" not in value:
        return f"{value!r} must be fully qualified (domain/name), e.g. gpu.nvidia.com/{value}"
    return qualified_name_error(value)


def validate(obj: object) -> list[FieldError]:
    """Validate any object the system reads: its names (`metadata_errors`), then its kind's rules."""
    errors = metadata_errors(obj)
    match obj:
        case DeviceClass():
            return errors + _device_class(obj)
        case ResourceClaim():
            return errors + _claim_spec(obj.spec, "spec")
        case ResourceClaimTemplate():
            return errors + _claim_spec(obj.spec.spec, "spec.spec")
        case ResourceSlice():
            return errors + _slice(obj)
        case DeviceTaintRule():
            return errors + _taint_rule(obj)
    return errors


_NAMESPACED = (ResourceClaim, ResourceClaimTemplate, Pod)
_DNS_SUBDOMAIN_RULE = "a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
_DNS_LABEL_RULE = "a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"


def name_error(name: str) -> str | None:
    """Why `name` is not a valid object name (a DNS subdomain, as the API server requires of
    claims, classes, slices and nodes), or None."""
    return None if is_dns_subdomain(name) else f"{name!r} is not {_DNS_SUBDOMAIN_RULE}"


def namespace_error(namespace: str) -> str | None:
    """Why `namespace` is not a valid namespace (a DNS label), or None."""
    return None if is_dns_label(namespace) else f"{namespace!r} is not {_DNS_LABEL_RULE}"


def pool_name_error(pool: str) -> str | None:
    """A pool name: DNS subdomains separated by '/', at most 253 characters in all."""
    if len(pool) > 253 or not all(is_dns_subdomain(part) for part in pool.split("/")):
        return f"{pool!r} is not a pool name: DNS subdomains separated by '/', at most 253 characters"
    return None


def metadata_errors(obj: object) -> list[FieldError]:
    """The object's names as the API server checks them: `metadata.name` a DNS subdomain (every
    kind read here), `metadata.namespace` a DNS label (namespaced kinds; empty means default).
    A name is also a NATS subject token and a KV key, so this is what keeps both well formed."""
    if not isinstance(obj, DeviceClass | ResourceClaim | ResourceClaimTemplate | ResourceSlice | Node | Pod | DeviceTaintRule):
        return []
    meta = obj.metadata
    errors = [FieldError("metadata.name", problem)] if (problem := name_error(meta.name)) else []
    if isinstance(obj, _NAMESPACED) and meta.namespace and (problem := namespace_error(meta.namespace)):
        errors.append(FieldError("metadata.namespace", problem))
    return errors


def _selectors(selectors: list[DeviceSelector], path: str) -> list[FieldError]:
    errors = []
    if len(selectors) > SELECTORS_MAX:
        errors.append(FieldError(path, f"must have at most {SELECTORS_MAX} selectors, has {len(selectors)}"))
    for i, selector in enumerate(selectors):
        if selector.cel is None:
            errors.append(FieldError(f"{path}[{i}].cel", "required"))
        elif len(selector.cel.expression) > CEL_EXPRESSION_MAX_LENGTH:
            errors.append(
                FieldError(
                    f"{path}[{i}].cel.expression",
                    f"too long: {len(selector.cel.expression)} characters, the limit is {CEL_EXPRESSION_MAX_LENGTH}",
                )
            )
        elif not selector.cel.expression.strip():
            errors.append(FieldError(f"{path}[{i}].cel.expression", "required"))
    return errors


def _device_class(cls: DeviceClass) -> list[FieldError]:
    errors = _selectors(cls.spec.selectors, "spec.selectors")
    if len(cls.spec.config) > CONFIG_MAX:
        errors.append(FieldError("spec.config", f"must have at most {CONFIG_MAX} entries"))
    for i, config in enumerate(cls.spec.config):
        if config.opaque is not None and not is_dns_subdomain(config.opaque.driver):
            errors.append(FieldError(f"spec.config[{i}].opaque.driver", "must be a DNS subdomain"))
    return errors


def _tolerations(tolerations: list[DeviceToleration], path: str) -> list[FieldError]:
    errors = []
    if len(tolerations) > TOLERATIONS_MAX:
        errors.append(FieldError(path, f"must have at most {TOLERATIONS_MAX} tolerations"))
    for i, toleration in enumerate(tolerations):
        if toleration.operator == "Exists" and toleration.value:
            errors.append(FieldError(f"{path}[{i}].value", "must be empty when operator is Exists"))
    return errors


def _request_body(
    device_class_name: str,
    selectors: list[DeviceSelector],
    mode: str | None,
    count: int | None,
    tolerations: list[DeviceToleration],
    path: str,
) -> list[FieldError]:
    errors = []
    if not device_class_name:
        errors.append(FieldError(f"{path}.deviceClassName", "required"))
    elif not is_dns_subdomain(device_class_name):
        errors.append(FieldError(f"{path}.deviceClassName", "must be a DNS subdomain"))
    errors += _selectors(selectors, f"{path}.selectors")
    if mode in (None, "ExactCount"):
        if count is not None and count <= 0:
            errors.append(FieldError(f"{path}.count", f"must be greater than zero, got {count}"))
    elif count is not None:
        errors.append(FieldError(f"{path}.count", "must not be set when allocationMode is All"))
    errors += _tolerations(tolerations, f"{path}.tolerations")
    return errors


def _claim_spec(spec: ResourceClaimSpec, path: str) -> list[FieldError]:
    devices, path = spec.devices, f"{path}.devices"
    errors: list[FieldError] = []
    if len(devices.requests) > REQUESTS_MAX:
        errors.append(FieldError(f"{path}.requests", f"must have at most {REQUESTS_MAX} requests, has {len(devices.requests)}"))
    names: set[str] = set()
    subrequest_names: set[str] = set()
    for i, request in enumerate(devices.requests):
        rpath = f"{path}.requests[{i}]"
        if not is_dns_label(request.name):
            errors.append(FieldError(f"{rpath}.name", f"{request.name!r} must be a DNS label"))
        if request.name in names:
            errors.append(FieldError(f"{rpath}.name", f"duplicate request name {request.name!r}"))
        names.add(request.name)
        if (request.exactly is None) == (not request.first_available):
            errors.append(FieldError(rpath, "exactly one of exactly and firstAvailable must be set"))
        if request.exactly is not None:
            e = request.exactly
            errors += _request_body(e.device_class_name, e.selectors, e.allocation_mode, e.count, e.tolerations, f"{rpath}.exactly")
        if len(request.first_available) > SUBREQUESTS_MAX:
            errors.append(FieldError(f"{rpath}.firstAvailable", f"must have at most {SUBREQUESTS_MAX} subrequests"))
        seen_sub: set[str] = set()
        for j, sub in enumerate(request.first_available):
            spath = f"{rpath}.firstAvailable[{j}]"
            if not is_dns_label(sub.name):
                errors.append(FieldError(f"{spath}.name", f"{sub.name!r} must be a DNS label"))
            if sub.name in seen_sub:
                errors.append(FieldError(f"{spath}.name", f"duplicate subrequest name {sub.name!r}"))
            seen_sub.add(sub.name)
            subrequest_names.add(f"{request.name}/{sub.name}")
            errors += _request_body(sub.device_class_name, sub.selectors, sub.allocation_mode, sub.count, sub.tolerations, spath)
    referable = names | subrequest_names
    if len(devices.constraints) > CONSTRAINTS_MAX:
        errors.append(FieldError(f"{path}.constraints", f"must have at most {CONSTRAINTS_MAX} constraints"))
    for i, constraint in enumerate(devices.constraints):
        cpath = f"{path}.constraints[{i}]"
        errors += _references(constraint.requests, referable, f"{cpath}.requests")
        attributes = [a for a in (constraint.match_attribute, constraint.distinct_attribute) if a is not None]
        if len(attributes) != 1:
            errors.append(FieldError(cpath, "exactly one of matchAttribute and distinctAttribute must be set"))
        for attribute in attributes:
            problem = fully_qualified_name_error(attribute)
            if problem:
                field = "matchAttribute" if attribute == constraint.match_attribute else "distinctAttribute"
                errors.append(FieldError(f"{cpath}.{field}", problem))
    if len(devices.config) > CONFIG_MAX:
        errors.append(FieldError(f"{path}.config", f"must have at most {CONFIG_MAX} entries"))
    for i, config in enumerate(devices.config):
        errors += _references(config.requests, referable, f"{path}.config[{i}].requests")
    return errors


def _references(requests: list[str], known: set[str], path: str) -> list[FieldError]:
    return [FieldError(f"{path}[{i}]", f"{name!r} is not the name of a request in this claim") for i, name in enumerate(requests) if name not in known]


def _slice(slice_: ResourceSlice) -> list[FieldError]:
    spec = slice_.spec
    errors = []
    if not is_dns_subdomain(spec.driver):
        errors.append(FieldError("spec.driver", f"{spec.driver!r} must be a DNS subdomain (e.g. gpu.nvidia.com)"))
    if problem := pool_name_error(spec.pool.name):
        errors.append(FieldError("spec.pool.name", problem))
    if spec.node_name is not None and (problem := name_error(spec.node_name)):
        errors.append(FieldError("spec.nodeName", problem))
    scopes = [spec.node_name is not None, spec.node_selector is not None, bool(spec.all_nodes), bool(spec.per_device_node_selection)]
    if sum(scopes) > 1 or (sum(scopes) == 0 and not spec.shared_counters):
        errors.append(FieldError("spec", "exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection must be set"))
    if len(spec.shared_counters) > SHARED_COUNTERS_MAX:
        errors.append(FieldError("spec.sharedCounters", f"must have at most {SHARED_COUNTERS_MAX} counter sets"))
    else:
        errors += _counter_sets([(cs.name, cs.counters) for cs in spec.shared_counters], COUNTERS_PER_SET_MAX, "spec.sharedCounters", "name")
    if problem := skip_node_operations_problem(spec.skip_node_operations):
        errors.append(FieldError("spec.skipNodeOperations", problem))
    if spec.partition_type_attribute is not None and (problem := fully_qualified_name_error(spec.partition_type_attribute)):
        errors.append(FieldError("spec.partitionTypeAttribute", problem))
    limited = any(d.consumes_counters or d.taints for d in spec.devices)
    limit = SLICE_DEVICES_WITH_COUNTERS_MAX if limited else SLICE_DEVICES_MAX
    if len(spec.devices) > limit:
        why = " with counters or taints" if limited else ""
        errors.append(FieldError("spec.devices", f"must have at most {limit} devices{why}, has {len(spec.devices)}"))
    names: set[str] = set()
    for i, device in enumerate(spec.devices):
        dpath = f"spec.devices[{i}]"
        if not is_dns_label(device.name):
            errors.append(FieldError(f"{dpath}.name", f"{device.name!r} must be a DNS label"))
        if device.name in names:
            errors.append(FieldError(f"{dpath}.name", f"duplicate device name {device.name!r}"))
        names.add(device.name)
        if len(device.attributes) + len(device.capacity) > ATTRIBUTES_AND_CAPACITY_MAX:
            errors.append(FieldError(dpath, f"at most {ATTRIBUTES_AND_CAPACITY_MAX} attributes and capacities together"))
        for key, attribute in device.attributes.items():
            problem = qualified_name_error(key)
            if problem:
                errors.append(FieldError(f"{dpath}.attributes[{key}]", problem))
            errors += _attribute(attribute, f"{dpath}.attributes[{key}]")
        values = sum(_attribute_values(a) for a in device.attributes.values())
        if values > ATTRIBUTE_VALUES_MAX:
            errors.append(
                FieldError(f"{dpath}.attributes", f"at most {ATTRIBUTE_VALUES_MAX} attribute values per device (list entries count one each), has {values}")
            )
        for key, capacity in device.capacity.items():
            problem = qualified_name_error(key)
            if problem:
                errors.append(FieldError(f"{dpath}.capacity[{key}]", problem))
            errors += _valid_range(capacity, f"{dpath}.capacity[{key}].requestPolicy.validRange")
        for resource, cost in (device.node_allocatable_resources or {}).items():
            errors += _node_allocatable(resource, cost, f"{dpath}.nodeAllocatableResources[{resource}]")
        consumptions = device.consumes_counters
        if len(consumptions) > CONSUMPTIONS_PER_DEVICE_MAX:
            errors.append(FieldError(f"{dpath}.consumesCounters", f"must have at most {CONSUMPTIONS_PER_DEVICE_MAX} entries, has {len(consumptions)}"))
        else:
            pairs = [(c.counter_set, c.counters) for c in consumptions]
            errors += _counter_sets(pairs, COUNTERS_PER_CONSUMPTION_MAX, f"{dpath}.consumesCounters", "counterSet")
            for j, groups in enumerate(c.compatibility_groups or [] for c in consumptions):
                if len(groups) > COMPATIBILITY_GROUPS_MAX or len(set(groups)) != len(groups):
                    where = f"{dpath}.consumesCounters[{j}].compatibilityGroups"
                    errors.append(FieldError(where, f"must have at most {COMPATIBILITY_GROUPS_MAX} names, each once"))
    return errors


def skip_node_operations_problem(operations: list[str]) -> str | None:
    """Why a slice's `skipNodeOperations` is not valid, or None, as the API server checks it: a set
    of `SKIP_NODE_OPERATIONS`, and NodePrepareResources only with NodeUnprepareResources (or "*"):
    a Pod whose preparation was skipped would otherwise wait, when it ends, for a node plugin that
    may not exist. Bounded: a list longer than the values there are holds a duplicate or a
    stranger, so at most 4 entries are looked at."""
    for operation in operations[: len(SKIP_NODE_OPERATIONS) + 1]:
        if operation not in SKIP_NODE_OPERATIONS:
            supported = ", ".join(f'"{value}"' for value in SKIP_NODE_OPERATIONS)
            return f"unsupported value {operation[:64]!r}: supported values: {supported}"
    if len(set(operations)) != len(operations):
        return "each operation at most once"
    if "NodePrepareResources" in operations and not {"NodeUnprepareResources", "*"} & set(operations):
        return 'NodePrepareResources may be skipped only with NodeUnprepareResources (or with "*")'
    return None


def _counter_sets(sets: list[tuple[str, dict[str, Counter]]], counters_max: int, path: str, name_field: str) -> list[FieldError]:
    """Counter sets as the API server checks them, where they are defined (`sharedCounters`:
    `name_field` "name") or consumed (a device's `consumesCounters`: "counterSet"): each set
    named once, by a DNS label, with 1 to `counters_max` counters named by DNS labels. Whether a
    consumed set and counter exist is the pool's question (the engine's pool validation), as
    in Kubernetes: the counters may be in another slice of the pool."""
    errors = []
    seen: set[str] = set()
    for i, (name, counters) in enumerate(sets):
        where = f"{path}[{i}]"
        if not is_dns_label(name):
            errors.append(FieldError(f"{where}.{name_field}", f"{name!r} is not {_DNS_LABEL_RULE}"))
        elif name in seen:
            errors.append(FieldError(f"{where}.{name_field}", f"duplicate counter set {name!r}"))
        seen.add(name)
        if not counters:
            errors.append(FieldError(f"{where}.counters", "must name at least one counter"))
        elif len(counters) > counters_max:
            errors.append(FieldError(f"{where}.counters", f"must have at most {counters_max} counters, has {len(counters)}"))
        else:
            errors += [FieldError(f"{where}.counters[{c}]", f"{c!r} is not {_DNS_LABEL_RULE}") for c in counters if not is_dns_label(c)]
    return errors


def _attribute_values(attribute: DeviceAttribute) -> int:
    """How many values an attribute holds (a list counts its entries)."""
    lists = (attribute.ints, attribute.bools, attribute.strings, attribute.versions)
    return sum(len(v) for v in lists if v is not None) + sum(v is not None for v in (attribute.int, attribute.bool, attribute.string, attribute.version))


def _attribute(attribute: DeviceAttribute, path: str) -> list[FieldError]:
    """One attribute: exactly one field set, lists non-empty, strings and versions at most
    64 bytes (KEP-5491 for the list fields). A version that does not parse, or an int
    outside int64, is the selectors' error at run time (the device's CEL view)."""
    set_fields = [name for name in _ATTRIBUTE_FIELDS if getattr(attribute, name) is not None]
    if len(set_fields) != 1:
        return [FieldError(path, "exactly one of " + ", ".join(_ATTRIBUTE_FIELDS) + " must be set")]
    name = set_fields[0]
    value = getattr(attribute, name)
    entries = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        return [FieldError(f"{path}.{name}", "must not be empty")]
    errors = []
    for i, entry in enumerate(entries):
        where = f"{path}.{name}[{i}]" if isinstance(value, list) else f"{path}.{name}"
        if name in ("string", "strings", "version", "versions") and len(entry.encode()) > ATTRIBUTE_VALUE_MAX_BYTES:
            errors.append(FieldError(where, f"must be at most {ATTRIBUTE_VALUE_MAX_BYTES} bytes, is {len(entry.encode())}"))
    return errors


_TAINT_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


def _taint_rule(rule: DeviceTaintRule) -> list[FieldError]:
    """A DeviceTaintRule: the selector's names are names the API accepts (driver a DNS
    subdomain, pool a pool name, device a DNS label), the taint has a label-style key and one
    of the three effects."""
    errors = []
    selector = rule.spec.device_selector
    if selector is not None:
        if selector.driver is not None and not is_dns_subdomain(selector.driver):
            errors.append(FieldError("spec.deviceSelector.driver", f"{selector.driver!r} must be a DNS subdomain"))
        if selector.pool is not None and (problem := pool_name_error(selector.pool)):
            errors.append(FieldError("spec.deviceSelector.pool", problem))
        if selector.device is not None and not is_dns_label(selector.device):
            errors.append(FieldError("spec.deviceSelector.device", f"{selector.device!r} must be a DNS label"))
    taint = rule.spec.taint
    name = taint.key.rpartition("/")[2]
    if not _TAINT_KEY.match(taint.key) or len(name) > 63:
        errors.append(
            FieldError("spec.taint.key", f"{taint.key!r} must be a label key (an optional DNS subdomain and '/', then at most 63 alphanumerics, '-', '_', '.')")
        )
    if taint.value is not None and len(taint.value) > 63:
        errors.append(FieldError("spec.taint.value", "must be at most 63 characters"))
    return errors


def _node_allocatable(resource: str, cost: NodeAllocatableResource, path: str) -> list[FieldError]:
    """A device's cost in a node resource (1.37 alpha DRANodeAllocatableResources): a node
    resource, not an extended one; a mapping, an overhead or both; a mapping by consumed capacity
    (`capacityKey` with `capacityMultiplier`) or by device count (`deviceMultiplier`), not both."""
    errors = []
    if "/" in resource and not resource.startswith("kubernetes.io/"):
        errors.append(FieldError(path, f"{resource!r} is an extended resource: only node resources such as cpu and memory"))
    if cost.mapping is None and cost.overhead is None:
        errors.append(FieldError(path, "needs a mapping, an overhead or both"))
    if (mapping := cost.mapping) is not None:
        by_capacity = mapping.capacity_key is not None or mapping.capacity_multiplier is not None
        if by_capacity == (mapping.device_multiplier is not None):
            errors.append(FieldError(f"{path}.mapping", "exactly one of capacityKey (with capacityMultiplier) and deviceMultiplier"))
        elif by_capacity and (mapping.capacity_key is None or mapping.capacity_multiplier is None):
            errors.append(FieldError(f"{path}.mapping", "capacityKey and capacityMultiplier go together"))
        elif mapping.capacity_key is not None and (problem := qualified_name_error(mapping.capacity_key)):
            errors.append(FieldError(f"{path}.mapping.capacityKey", problem))
    amounts: list[tuple[str, Quantity | None]] = []
    if mapping is not None:
        amounts += [("mapping.capacityMultiplier", mapping.capacity_multiplier), ("mapping.deviceMultiplier", mapping.device_multiplier)]
    if (overhead := cost.overhead) is not None:
        amounts += [("overhead.perPod", overhead.per_pod), ("overhead.perContainer", overhead.per_container)]
    for name, value in amounts:
        if value is not None:
            try:
                parse_quantity(value)
            except ValueError as exc:
                errors.append(FieldError(f"{path}.{name}", str(exc)))
    return errors


def _valid_range(capacity: DeviceCapacity, path: str) -> list[FieldError]:
    """DRAFractionalCapacityRange (1.37 beta): a range's min, max and step may be fractional,
    computed in milli-units, so at most 3 decimal places (``100m``, ``0.25``; not ``0.0005``)."""
    policy = capacity.request_policy
    if policy is None or policy.valid_range is None:
        return []
    errors = []
    for name in ("min", "max", "step"):
        value = getattr(policy.valid_range, name)
        if value is None:
            continue
        try:
            nano = parse_quantity(value)
        except ValueError as exc:
            errors.append(FieldError(f"{path}.{name}", str(exc)))
            continue
        if nano % 1_000_000:
            errors.append(FieldError(f"{path}.{name}", f"{value!r} has more than 3 decimal places (the range is computed in milli-units)"))
    return errors
