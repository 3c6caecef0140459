"""`dralloc get claims|nodes|devices|slices|classes [NAME]`: the fleet from the bus, kubectl-style.

Claims come from the status writer's store (each claim's latest decision);
nodes, devices, slices and classes from the latest inventory and decisions
on the bus (`busview`). `-o` is `table` (default), `wide`, `json`, `yaml`
or `name`; on a terminal long cells are cut to fit, piped they never are.
`--watch` prints the table, then a row whenever one changes, until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import msgspec
import yaml
from rich.console import Console
from rich.table import Table

from dralloc.client.fleetview import FleetState, age, class_usage, domain_usage, node_usage, percent
from dralloc.schemas.status import ClaimStatus

KINDS = ("claims", "nodes", "devices", "slices", "classes")
OUTPUTS = ("table", "wide", "json", "yaml", "name")
MESSAGE_WIDTH = 60
"""A message cell longer than this is cut in the default table (wide and piped output keep it whole)."""


class GetError(ValueError):
    """A bad argument (unknown kind or output, a NAME that matches nothing): exit 2 or 1."""


def table(*columns: str, title: str | None = None, caption: str | None = None) -> Table:
    """The one table style of dralloc's views: no box, bold headers (kubectl's look)."""
    return Table(*columns, title=title, caption=caption, box=None, header_style="bold", title_justify="left", pad_edge=False)


@dataclass(frozen=True, slots=True)
class View:
    """Rows for one kind: column names, rows (cells), the name of each row, and objects for json/yaml."""

    columns: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    names: Sequence[str]
    objects: Sequence[object]
    extra: list[Table] | None = None


def _claim_age(status: ClaimStatus, now: float) -> str:
    try:
        return age(datetime.datetime.fromisoformat(status.updated.replace("Z", "+00:00")).timestamp(), now)
    except ValueError:
        return ""


def claims_view(statuses: Sequence[ClaimStatus], *, wide: bool, cut: bool, now: float) -> View:
    """CLAIM STATUS NODE DEVICES MESSAGE AGE (the devices' names; wide: driver/pool/device too)."""
    rows, names, objects = [], [], []
    for s in statuses:
        results = s.allocation.devices.results if s.allocation else []
        if wide:
            devices = ",".join(f"{r.driver}/{r.pool}/{r.device}" for r in results)
        else:
            devices = ",".join(r.device if r.pool == s.node else f"{r.pool}/{r.device}" for r in results)
        message = s.message if not cut or len(s.message) <= MESSAGE_WIDTH else s.message[: MESSAGE_WIDTH - 3] + "..."
        rows.append((s.claim, s.state, s.node or "", devices, message, _claim_age(s, now)))
        names.append(f"resourceclaim.resource.k8s.io/{s.claim.partition('/')[2]}")
        objects.append(msgspec.to_builtins(s))
    return View(("CLAIM", "STATUS", "NODE", "DEVICES", "MESSAGE", "AGE"), rows, names, objects)


def nodes_view(state: FleetState, *, wide: bool, now: float) -> View:
    """NODE PROFILE GPUS USED PARTITIONED FREE FRAGMENTATION NVLINK-DOMAINS AGE, then the NVLink domains."""
    usage = node_usage(state)
    domains_of: dict[str, list[str]] = {}
    for d in domain_usage(state):
        for n in d.nodes:
            domains_of.setdefault(n, []).append(d.name)
    rows, names, objects = [], [], []
    for u in usage:
        node = state.nodes.get(u.name)
        profile = node[0].metadata.labels.get("dralloc.dev/hardware-profile", "") if node else ""
        since = node[1] if node else None
        domains = domains_of.get(u.name, [])
        rows.append(
            (
                u.name,
                profile,
                str(u.total),
                str(u.used),
                str(u.partitioned),
                str(u.free),
                percent(u.fragmentation),
                ",".join(domains) if wide or len(domains) <= 1 else f"{domains[0]} +{len(domains) - 1}",
                age(since, now),
            )
        )
        names.append(f"node/{u.name}")
        objects.append({**asdict(u), "nodes": list(u.nodes), "profile": profile, "fragmentation": round(u.fragmentation, 4), "nvlinkDomains": domains})
    extra = []
    domain_rows = domain_usage(state)
    if domain_rows:
        t = table("NVLINK DOMAIN", "NODES", "GPUS", "USED", "PARTITIONED", "FREE", "FRAGMENTATION")
        for d in domain_rows:
            t.add_row(d.name, str(len(d.nodes)), str(d.total), str(d.used), str(d.partitioned), str(d.free), percent(d.fragmentation))
        extra.append(t)
    return View(("NODE", "PROFILE", "GPUS", "USED", "PARTITIONED", "FREE", "FRAGMENTATION", "NVLINK DOMAINS", "AGE"), rows, names, objects, extra)


def devices_view(state: FleetState, *, wide: bool, now: float) -> View:
    """NODE DEVICE KIND PRODUCT STATE CLAIM (wide: DRIVER POOL NVLINK-DOMAIN PARENT)."""
    rows, names, objects = [], [], []
    for r in state.devices():
        base = (r.node, r.name, r.kind, r.product, r.state, r.holder)
        rows.append(base + ((r.driver, r.pool, r.domain, r.parent) if wide else ()))
        names.append(f"device/{r.driver}/{r.pool}/{r.name}")
        objects.append(asdict(r))
    columns = ("NODE", "DEVICE", "KIND", "PRODUCT", "STATE", "CLAIM") + (("DRIVER", "POOL", "NVLINK DOMAIN", "PARENT") if wide else ())
    return View(columns, rows, names, objects)


def slices_view(state: FleetState, *, wide: bool, now: float) -> View:
    """SLICE DRIVER POOL NODE DEVICES GENERATION AGE."""
    rows, names, objects = [], [], []
    for (_, _, _), (s, since) in sorted(state.slices.items()):
        node = s.spec.node_name or ("(all nodes)" if s.spec.all_nodes else "(selector)" if s.spec.node_selector else "")
        rows.append((s.metadata.name, s.spec.driver, s.spec.pool.name, node, str(len(s.spec.devices)), str(s.spec.pool.generation), age(since, now)))
        names.append(f"resourceslice.resource.k8s.io/{s.metadata.name}")
        objects.append(msgspec.to_builtins(s))
    return View(("SLICE", "DRIVER", "POOL", "NODE", "DEVICES", "GENERATION", "AGE"), rows, names, objects)


def classes_view(state: FleetState, *, wide: bool, now: float) -> View:
    """CLASS DEVICES USED FREE EXTENDED-RESOURCE AGE (wide: SELECTORS)."""
    usage = {name: (m, u, f) for name, m, u, f in class_usage(state)}
    rows, names, objects = [], [], []
    for name, (cls, since) in sorted(state.classes.items()):
        matched, used, free = usage.get(name, (0, 0, 0))
        row: tuple[str, ...] = (name, str(matched), str(used), str(free), cls.spec.extended_resource_name or "", age(since, now))
        if wide:
            row += (" && ".join(s.cel.expression for s in cls.spec.selectors if s.cel is not None),)
        rows.append(row)
        names.append(f"deviceclass.resource.k8s.io/{name}")
        objects.append(msgspec.to_builtins(cls))
    return View(("CLASS", "DEVICES", "USED", "FREE", "EXTENDED RESOURCE", "AGE") + (("SELECTORS",) if wide else ()), rows, names, objects)


VIEWS: dict[str, Callable[..., View]] = {"nodes": nodes_view, "devices": devices_view, "slices": slices_view, "classes": classes_view}


def select(view: View, name: str | None, *, columns: tuple[int, ...] = (0,)) -> View:
    """Only the rows where one of `columns` is `name` (a claim: `ns/name` or its name alone; a device:
    its node or its name); raises GetError when none is."""
    if name is None:
        return view
    keep = [i for i, row in enumerate(view.rows) if any(row[c] == name or row[c].partition("/")[2] == name for c in columns)]
    if not keep:
        raise GetError(f"{name!r} not found")
    return View(view.columns, [view.rows[i] for i in keep], [view.names[i] for i in keep], [view.objects[i] for i in keep], view.extra)


def render(view: View, kind: str, output: str, console: Console) -> None:
    """Print a view: a table (plus any extra tables), or json/yaml/name for machines."""
    if output == "json":
        console.file.write(json.dumps({kind: view.objects}, indent=2) + "\n")
    elif output == "yaml":
        console.file.write(yaml.safe_dump({kind: view.objects}, sort_keys=False))
    elif output == "name":
        console.file.write("".join(f"{n}\n" for n in view.names))
    else:
        t = table(*view.columns, caption=None if view.rows else f"no {kind}")
        for row in view.rows:
            t.add_row(*row)
        console.print(t)
        for extra in view.extra or []:
            console.print()
            console.print(extra)


def console_for(interactive: bool, width: int | None = None) -> Console:
    """On a terminal: its width, cells cut to fit. Piped: wide enough that no name is ever cut."""
    if interactive:
        return Console(width=width)
    return Console(width=width or 100_000, no_color=True, highlight=False, soft_wrap=False)


def changed_rows(before: dict[str, tuple[str, ...]], view: View) -> list[tuple[str, ...]]:
    """Rows of `view` that are new or differ from `before` (keyed by row name; AGE, which changes by
    itself, not compared); updates `before`."""
    keep = [i for i, c in enumerate(view.columns) if c != "AGE"]
    out = []
    for name, row in zip(view.names, view.rows):
        compared = tuple(row[i] for i in keep)
        if before.get(name) != compared:
            before[name] = compared
            out.append(row)
    return out


def _in_namespace(statuses: Sequence[ClaimStatus], namespace: str | None) -> list[ClaimStatus]:
    return [s for s in statuses if namespace is None or s.claim.partition("/")[0] == namespace]


def _decisions(state: FleetState) -> list[ClaimStatus]:
    return sorted((s for s, _ in state.decisions.values()), key=lambda s: s.claim)


async def run_get(
    url: str | None,
    kind: str,
    name: str | None,
    *,
    namespace: str | None,
    output: str,
    console: Console,
    watch: bool = False,
    bucket: str | None = None,
    warn: Callable[[str], None] = lambda _: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Fetch, render; with `watch`, then print each row that changes until `stop` is set (or Ctrl-C).
    Raises GetError for a bad argument or a NAME that matches nothing, BusError when the bus is unreachable."""
    from dralloc.bus import Bus
    from dralloc.client.busview import following, snapshot
    from dralloc.client.show import fetch_claims

    if kind not in KINDS:
        raise GetError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    if output not in OUTPUTS:
        raise GetError(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}")
    wide, cut = output == "wide", console.is_terminal

    def view_of(state: FleetState | None, statuses: Sequence[ClaimStatus] | None) -> View:
        now = time.time()
        if kind == "claims":
            return select(claims_view(_in_namespace(statuses or [], namespace), wide=wide, cut=cut, now=now), name)
        assert state is not None
        return select(VIEWS[kind](state, wide=wide, now=now), name, columns=(0, 1) if kind == "devices" else (0,))

    if kind == "claims" and not watch:
        statuses, unreadable = await fetch_claims(url, bucket)
        for problem in unreadable:
            warn(f"skipped {problem}")
        render(view_of(None, statuses), kind, output, console)
        return
    async with await Bus.connect(url, name="get") as bus:
        state, last = await snapshot(bus)
        view = view_of(state, _decisions(state))
        render(view, kind, output, console)
        if not watch:
            return
        printed: dict[str, tuple[str, ...]] = {}
        changed_rows(printed, view)
        async with following(bus, state, last) as changed:
            while stop is None or not stop.is_set():
                waiter = asyncio.ensure_future(changed.wait())
                stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
                await asyncio.wait([w for w in (waiter, stopper) if w is not None], return_when=asyncio.FIRST_COMPLETED)
                for w in (waiter, stopper):
                    if w is not None and not w.done():
                        w.cancel()
                changed.clear()
                try:
                    fresh = view_of(state, _decisions(state))
                except GetError:
                    continue  # NAME not there (yet)
                rows = changed_rows(printed, fresh)
                if rows:
                    t = table(*fresh.columns)
                    t.show_header = False
                    for row in rows:
                        t.add_row(*row)
                    console.print(t)
