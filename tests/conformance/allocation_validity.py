"""An independent check that allocations are valid for their inputs.

Written from the API's rules, not from the engine's code, so the conformance
and property tests have an oracle: every device exists in the current
generation of its pool and is reachable from the node; selectors (`eligible`,
when given) accept it; no exclusive device is used twice (admin access may
reuse a device, but not twice in one claim); shared devices stay within
capacity; counters stay within their sets (a device consumes its counters
while in use, once); matchAttribute / distinctAttribute hold over every device
they cover; NoSchedule / NoExecute taints are tolerated.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from typing import Any

import yaml

from dralloc.manifests import Loaded, Source, decode_object
from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import AllocationResult, DeviceTaintRule, Node, ResourceClaim, ResourceSlice


def load_documents(text: str, path: str = "<test>") -> list[Any]:
    """Objects of a manifest text, decoded by the project's reader (libyaml for speed)."""
    out = []
    for index, doc in enumerate(yaml.load_all(text, Loader=yaml.CSafeLoader), start=1):
        if doc is None or doc.get("kind") == "DifferentialCase":
            continue
        decoded = decode_object(doc, Source(path, index))
        assert isinstance(decoded, Loaded), str(decoded)
        out.append(decoded.obj)
    return out


def _node_ok(spec_node: str | None, selector: Any, all_nodes: bool, node: str, labels: dict[str, str]) -> bool:
    if spec_node:
        return spec_node == node
    if all_nodes:
        return True
    if selector is None:
        return False
    for term in selector.node_selector_terms:
        reqs = [(r, labels) for r in term.match_expressions] + [(r, {"metadata.name": node}) for r in term.match_fields]
        if reqs and all(_req(r, lab) for r, lab in reqs):
            return True
    return False


def _req(r: Any, labels: dict[str, str]) -> bool:
    v = labels.get(r.key)
    return {
        "In": lambda: v is not None and v in r.values,
        "NotIn": lambda: v is None or v not in r.values,
        "Exists": lambda: v is not None,
        "DoesNotExist": lambda: v is None,
        "Gt": lambda: v is not None and v.lstrip("-").isdigit() and int(v) > int(r.values[0]),
        "Lt": lambda: v is not None and v.lstrip("-").isdigit() and int(v) < int(r.values[0]),
    }[r.operator]()


def _attr(device: Any, driver: str, name: str) -> Any:
    a = device.attributes.get(name)
    if a is None and name.startswith(driver + "/"):
        a = device.attributes.get(name[len(driver) + 1 :])
    if a is None:
        return None
    for kind in ("string", "int", "bool", "version"):
        if getattr(a, kind) is not None:
            return frozenset([(kind, getattr(a, kind))])
    for kind in ("strings", "ints", "bools", "versions"):  # list attributes (KEP-5491): a set of typed values
        if getattr(a, kind) is not None:
            return frozenset((kind[:-1], v) for v in getattr(a, kind))
    return None


def _tolerated(taint: Any, tolerations: list[Any]) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.key and t.key != taint.key:
            continue
        if (t.operator or "Equal") == "Exists" or ((t.value or "") == (taint.value or "") and t.key):
            return True
    return False


def check(objects: list[Any], allocations: dict[str, AllocationResult], node: str, eligible: dict | None = None) -> list[str]:
    """Problems with `allocations` (claim key -> result) given the input objects."""
    problems: list[str] = []
    labels = {o.metadata.name: o.metadata.labels for o in objects if isinstance(o, Node)}.get(node, {})
    slices = [o for o in objects if isinstance(o, ResourceSlice)]
    newest: dict[tuple, int] = {}
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        newest[key] = max(newest.get(key, s.spec.pool.generation), s.spec.pool.generation)
    devices: dict[tuple, tuple[Any, Any]] = {}
    counters: dict[tuple, int] = {}
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        if s.spec.pool.generation != newest[key]:
            continue
        for cs in s.spec.shared_counters:
            for name, c in cs.counters.items():
                counters[(*key, cs.name, name)] = parse_quantity(c.value)
        for d in s.spec.devices:
            devices[(*key, d.name)] = (s, d)
    claims = {o.key: o for o in objects if isinstance(o, ResourceClaim)}
    existing = {k: c.status.allocation for k, c in claims.items() if c.status is not None and c.status.allocation is not None}
    everything = {**existing, **allocations}
    exclusive: Counter = Counter()
    whole: Counter = Counter()
    shares: Counter = Counter()
    cap_used: dict[tuple, Counter] = defaultdict(Counter)
    active: set[tuple] = set()
    for claim_key, alloc in everything.items():
        admin_seen: set[tuple] = set()
        in_claim = Counter((r.driver, r.pool, r.device) for r in alloc.devices.results)
        for r in alloc.devices.results:
            dkey = (r.driver, r.pool, r.device)
            found = devices.get(dkey)
            if found is None:
                if claim_key in allocations:
                    problems.append(f"{claim_key}: device {dkey} is not in the current generation of its pool")
                continue
            _, device = found
            if r.admin_access:
                if dkey in admin_seen or in_claim[dkey] > 1:
                    problems.append(f"{claim_key}: admin device {dkey} twice in one claim")
                admin_seen.add(dkey)
                continue
            active.add(dkey)
            if device.allow_multiple_allocations:
                for name, value in r.consumed_capacity.items():
                    cap_used[dkey][name] += parse_quantity(value)
                if r.share_id is None:
                    whole[dkey] += 1  # no shareID: the device is held whole (Kubernetes' AllocatedDevices)
                else:
                    shares[dkey] += 1
            else:
                exclusive[dkey] += 1
    for dkey, n in exclusive.items():
        if n > 1:
            problems.append(f"device {dkey} allocated {n} times")
    for dkey, n in whole.items():
        if n + shares[dkey] > 1:
            problems.append(f"shared device {dkey} is held whole by a result without shareID and allocated {n + shares[dkey] - 1} more time(s)")
    for dkey, used in cap_used.items():
        _, device = devices[dkey]
        for name, amount in used.items():
            total = device.capacity.get(name) or device.capacity.get(name.split("/")[-1])
            if total is None or amount > parse_quantity(total.value):
                problems.append(f"shared device {dkey}: capacity {name} over-used ({amount})")
    consumed: Counter = Counter()
    for dkey in active:
        _, device = devices[dkey]
        for cc in device.consumes_counters:
            for name, c in cc.counters.items():
                consumed[(dkey[0], dkey[1], cc.counter_set, name)] += parse_quantity(c.value)
    for ckey, amount in consumed.items():
        if amount > counters.get(ckey, 0):
            problems.append(f"counter {ckey} over-used: {amount} > {counters.get(ckey, 0)}")
    for claim_key, alloc in allocations.items():
        claim = claims[claim_key]
        by_request: dict[str, list[tuple]] = defaultdict(list)
        for r in alloc.devices.results:
            dkey = (r.driver, r.pool, r.device)
            by_request[r.request].append(dkey)
            if dkey not in devices:
                continue
            s, device = devices[dkey]
            spec = s.spec
            if r.skip_node_operations != spec.skip_node_operations:
                problems.append(f"{claim_key}: device {dkey} has skipNodeOperations {r.skip_node_operations}, its slice {spec.skip_node_operations}")
            if spec.per_device_node_selection:
                reach = _node_ok(device.node_name, device.node_selector, bool(device.all_nodes), node, labels)
            else:
                reach = _node_ok(spec.node_name, spec.node_selector, bool(spec.all_nodes), node, labels)
            if not reach:
                problems.append(f"{claim_key}: device {dkey} is not reachable from {node}")
            if eligible is not None and "/".join(dkey) not in eligible.get(claim_key, {}).get(r.request, []):
                problems.append(f"{claim_key}: device {dkey} not eligible for {r.request}")
            request = _request(claim, r.request)
            rule_taints = [
                o.spec.taint
                for o in objects
                if isinstance(o, DeviceTaintRule)
                and o.spec.device_selector is not None
                and all(
                    want is None or want == have
                    for want, have in zip((o.spec.device_selector.driver, o.spec.device_selector.pool, o.spec.device_selector.device), dkey)
                )
            ]
            for taint in [*device.taints, *rule_taints]:
                if taint.effect in ("NoSchedule", "NoExecute") and not _tolerated(taint, request.tolerations):
                    problems.append(f"{claim_key}: taint {taint.key} on {dkey} not tolerated")
        for c in claim.spec.devices.constraints:
            attribute = c.match_attribute or c.distinct_attribute
            covered = [dkey for name, keys in by_request.items() for dkey in keys if not c.requests or name in c.requests or name.split("/")[0] in c.requests]
            values = [_attr(devices[d][1], d[0], attribute) for d in covered if d in devices]
            if any(v is None for v in values):
                problems.append(f"{claim_key}: a device lacks constraint attribute {attribute}")
            elif c.match_attribute and values and not frozenset.intersection(*values):
                problems.append(f"{claim_key}: matchAttribute {attribute} broken (no value every device has): {values}")
            elif c.distinct_attribute and any(a & b for a, b in itertools.combinations(values, 2)):
                problems.append(f"{claim_key}: distinctAttribute {attribute} broken (sets not pairwise disjoint): {values}")
    return problems


def _request(claim: ResourceClaim, name: str) -> Any:
    base, _, sub = name.partition("/")
    for r in claim.spec.devices.requests:
        if r.name == base:
            if not sub:
                return r.exactly
            return next(s for s in r.first_available if s.name == sub)
    raise AssertionError(f"{claim.key}: no request {name}")
