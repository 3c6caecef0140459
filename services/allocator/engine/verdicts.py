"""Selector verdicts per device, cached until the device's slice changes.

A verdict is keyed by (class name, class version, request selectors): the
class selectors run first, in order, then the request's, stopping at the first
`false` as Kubernetes does. Each key keeps three bitsets over device ids:
evaluated, matched, failed (a CEL runtime error), so a device is evaluated at
most once per key. Device ids change when a slice changes, so a changed
device is simply a new, unevaluated id.

The CEL runtime-error rule (dralloc's, documented in `dralloc explain
--help`): a selector that fails at run time on any device the request could
otherwise take (reachable from the node being considered, in a usable pool,
not held exclusively by another claim unless the request has admin access or
asks for All) makes the claim an `error`, whatever order the search would have
visited devices in. Upstream Kubernetes reports such an error only if its
search happens to reach that device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from dralloc.allocator.engine import cel
from dralloc.allocator.engine.inventory import DeviceRec, Inventory, bits_of, iter_bits
from dralloc.allocator.engine.plan import Alt

MAX_KEYS = 4096


@dataclass(slots=True)
class Verdict:
    evaluated: int = 0
    matched: int = 0
    failed: int = 0
    errors: dict[int, str] = field(default_factory=dict)  # device id -> "selector #i on device ...: ..."
    nodes: tuple[int, int] | None = None  # (inventory version, node-rank bitset) for the node prefilter


class Verdicts:
    def __init__(self, inventory: Inventory) -> None:
        self.inv = inventory
        self._cache: OrderedDict[tuple, Verdict] = OrderedDict()

    def get(self, alt: Alt, mask: int) -> Verdict:
        """The verdict for `alt`, evaluated at least on the devices in `mask`."""
        full = self._entry(alt.verdict_key)
        todo = mask & self.inv.live & ~full.evaluated
        if todo:
            cls = self._entry(alt.class_key)
            self._evaluate(cls, todo, [s.cel.expression if s.cel else "" for s in alt.cls.spec.selectors], f"class {alt.cls.metadata.name}: ")
            passed = todo & cls.matched
            full.failed |= todo & cls.failed
            for i in iter_bits(todo & cls.failed):
                full.errors[i] = cls.errors[i]
            if alt.selectors:
                self._evaluate(full, passed, list(alt.selectors), "")
            else:
                full.matched |= passed
            full.evaluated |= todo
        return full

    def class_only(self, alt: Alt, mask: int) -> Verdict:
        """The verdict of the class selectors alone (for `explain`)."""
        entry = self._entry(alt.class_key)
        self._evaluate(entry, mask & self.inv.live, [s.cel.expression if s.cel else "" for s in alt.cls.spec.selectors], f"class {alt.cls.metadata.name}: ")
        return entry

    def _entry(self, key: tuple) -> Verdict:
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = Verdict()
            if len(self._cache) > MAX_KEYS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return entry

    def _evaluate(self, entry: Verdict, todo: int, exprs: list[str], owner: str) -> None:
        """Evaluate `exprs` on the devices in `todo` not yet evaluated for `entry`."""
        todo &= ~entry.evaluated
        if not todo:
            return
        compiled = [cel.compile_selector(e) for e in exprs]
        devices = self.inv.devices
        matched: list[int] = []
        failed: list[int] = []
        for i in iter_bits(todo):
            rec: DeviceRec = devices[i]  # type: ignore[assignment]
            env = rec.env
            if env is None:
                env = rec.env = cel.device_env(rec.driver, rec.spec)
            ok = True
            for n, selector in enumerate(compiled):
                try:
                    if not selector.matches(env):
                        ok = False
                        break
                except cel.CelRuntimeError as exc:
                    failed.append(i)
                    entry.errors[i] = f"{owner}selector #{n} on device {rec.label}: CEL runtime error: {exc}"
                    ok = False
                    break
            if ok:
                matched.append(i)
        entry.evaluated |= todo
        entry.matched |= bits_of(matched)
        entry.failed |= bits_of(failed)
