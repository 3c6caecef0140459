"""`dralloc`: the command line.

Each command is a thin shell: read arguments, call the module that does the
work, print for people (rich tables) or machines (stable JSON). Commands
import their implementation lazily so that `dralloc --help` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

import typer

from dralloc.clihelp import Group
from dralloc.errors import UsageError

app = typer.Typer(
    cls=Group,
    rich_markup_mode=None,  # plain help columns, as kubectl prints them (dralloc.clihelp)
    name="dralloc",
    help="Kubernetes DRA (resource.k8s.io/v1) device allocation over NATS JetStream.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"dralloc: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"dralloc {version('dralloc')}")
        raise typer.Exit(0)


@app.callback()
def _root(
    _version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
) -> None:
    """Kubernetes DRA (resource.k8s.io/v1) device allocation over NATS JetStream."""
    # A callback keeps `dralloc` a command group even while it has one command.


@app.command()
def discover(
    profile: str = typer.Option(None, "--profile", help="Simulate a node of this hardware profile (see --list-profiles)."),
    replay: str = typer.Option(None, "--replay", help="Answer NVML queries from a captured inventory JSON."),
    node: str = typer.Option(None, "--node", help="Node name (default: $NODE_NAME, else the hostname)."),
    layout: str = typer.Option("1.35", "--layout", help="ResourceSlice layout: 1.35 (separate counter slices) or 1.34."),
    mig: bool = typer.Option(True, "--mig/--no-mig", help="Publish MIG-capable GPUs as partitionable devices."),
    nics: bool = typer.Option(False, "--nics", help="With NVML: also this machine's physical NICs (sysfs), as driver dra.net."),
    capture: str = typer.Option(None, "--capture", help="Also write every NVML answer to this file (what --replay reads)."),
    output: str = typer.Option("yaml", "--output", "-o", help="yaml, json or table."),
    list_profiles: bool = typer.Option(False, "--list-profiles", help="List the hardware profiles and exit."),
) -> None:
    """Print the ResourceSlices this node would publish (NVML, a replayed capture, or a profile)."""
    from dralloc.discovery.discover import OUTPUTS, default_node_name, inventory_from, render
    from dralloc.discovery.nvml import NvmlUnavailable
    from dralloc.discovery.profiles import PROFILES
    from dralloc.discovery.replay import ReplayError
    from dralloc.discovery.slices import LAYOUTS, build_slices

    if list_profiles:
        for name, hw in PROFILES.items():
            print(f"{name:16} {hw.description}")
        return
    if profile and replay:
        fail("--profile and --replay exclude each other: pick one source")
    if profile and capture:
        fail("--capture records NVML's answers; a --profile has none")
    if output not in OUTPUTS:
        fail(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}")
    if layout not in LAYOUTS:
        fail(f"--layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    try:
        inventory = inventory_from(profile=profile, replay=replay, node=node or default_node_name(), mig=mig, nics=nics, capture=capture)
    except NvmlUnavailable as exc:
        fail(f"{exc}. No NVIDIA GPU is usable here; use --profile NAME to simulate one, or --replay FILE.", 1)
    except (ReplayError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--capture {capture}: cannot write: {exc.strerror or exc}")
    print(render(build_slices(inventory, layout=layout), output))


# --- services on the bus: run, submit, get, demo, schemas -------------------------

NATS_URL_HELP = "NATS server URL (default: $NATS_URL, else nats://127.0.0.1:4222)."

run_app = typer.Typer(
    cls=Group, rich_markup_mode=None, help="Run one service (for containers and compose.yaml); stops on SIGINT/SIGTERM.", no_args_is_help=True
)
app.add_typer(run_app, name="run")


def _serve(name: str, module: str, nats_url: str | None, **overrides: object) -> None:
    """Build the service's Config from environment + flags and run it until a signal."""
    import asyncio
    import importlib
    import logging
    import os

    from dralloc.bus import BusError, run_service

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    service = importlib.import_module(module)
    try:
        config = service.Config.from_env(**overrides)
    except ValueError as exc:
        fail(str(exc))
    try:
        asyncio.run(run_service(name, service.serve, config, nats_url))
    except BusError as exc:
        fail(str(exc), 1)
    except UsageError as exc:  # a configuration mistake found at start: exit 2, like a bad flag
        fail(str(exc))
    except Exception as exc:  # a crash: one line (the traceback only with DRALLOC_DEBUG=1)
        logging.getLogger(f"dralloc.{name}").error("stopped: %s", exc, exc_info=bool(os.environ.get("DRALLOC_DEBUG")))
        fail(f"{name} stopped: {exc}", 1)


@run_app.command("discovery")
def run_discovery(
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    source: str = typer.Option(None, "--source", help="nvml (default), profile, replay or fleet."),
    profile: str = typer.Option(None, "--profile", help="Hardware profile to simulate (--source profile)."),
    fleet: str = typer.Option(None, "--fleet", help="Fleet file of simulated nodes (--source fleet)."),
    node: str = typer.Option(None, "--node", help="Node name (default: $NODE_NAME, else the hostname)."),
    interval: float = typer.Option(None, "--interval", help="Seconds between rescans (NVML and replay)."),
) -> None:
    """Publish this node's ResourceSlices (NVML, or simulated nodes from hardware profiles)."""
    _serve("discovery", "dralloc.discovery.service", nats_url, source=source, profile=profile, fleet=fleet, node=node, interval=interval)


@run_app.command("ingestor")
def run_ingestor(
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    source: str = typer.Option(None, "--source", help="files (default) or kubernetes."),
    paths: list[str] = typer.Option([], "-f", "--filename", help="Manifest file or directory (repeatable)."),
    watch: bool = typer.Option(None, "--watch/--once", help="Keep following the files (default) or publish once and exit."),
    namespace: str = typer.Option(None, "--namespace", help="Kubernetes source: one namespace (default: all)."),
) -> None:
    """Publish ResourceClaims (Pods' claim templates expanded), DeviceClasses and slices from files or Kubernetes."""
    _serve("ingestor", "dralloc.ingestor.service", nats_url, source=source, paths=paths, watch=watch, namespace=namespace)


@run_app.command("allocator")
def run_allocator(nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP)) -> None:
    """Allocate submitted claims and publish the decisions (the only writer of allocations)."""
    _serve("allocator", "dralloc.allocator.service", nats_url)


@run_app.command("statuswriter")
def run_statuswriter(
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    sink: str = typer.Option(None, "--sink", help="local (JetStream KV, default) or kubernetes."),
    bucket: str = typer.Option(None, "--bucket", help="KV bucket of the local store."),
) -> None:
    """Write each claim's latest allocation to the local store or the Kubernetes API."""
    _serve("statuswriter", "dralloc.statuswriter.service", nats_url, sink=sink, bucket=bucket)


@app.command()
def submit(
    paths: list[str] = typer.Option(..., "-f", "--filename", help="Manifest file or directory (repeatable)."),
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    output: str = typer.Option("table", "--output", "-o", help="table or json."),
    wait: float = typer.Option(
        0.0, "--wait", metavar="SECONDS", help="Wait up to this long for the decisions and show them; returns once every claim is allocated or failed for good."
    ),
    gang: str = typer.Option(
        None, "--gang", metavar="NAME", help="The claims are one gang (the pods of one job): all allocated inside one topology domain, or none."
    ),
    gang_domain: str = typer.Option(
        None,
        "--gang-domain",
        metavar="LABEL",
        help='With --gang: the node label key whose values are the domains; "" for any nodes (default: NVLink clique, else dralloc.dev/rack).',
    ),
) -> None:
    """Publish claims (and classes, slices, Pods' claim templates) from files to the bus.

    Bad documents are reported on stderr (file, object, field) and skipped; the
    rest is published. Exit 2 when some input was bad; with --wait, 1 when a
    claim was not allocated in time; 1 when the bus cannot be reached; else 0.
    """
    from dralloc.client.submit import submit_paths, unsettled_summary

    if gang_domain is not None and not gang:
        fail("--gang-domain needs --gang NAME")
    submission = _publish_files(lambda report: submit_paths(paths, nats_url, report, wait=wait, gang=gang, gang_domain=gang_domain), output)
    if submission.decisions is not None and (summary := unsettled_summary(submission.decisions, wait)):
        print(f"dralloc: {summary}", file=sys.stderr)
    if submission.decisions is not None and any(d.state != "allocated" for d in submission.decisions):
        raise typer.Exit(1)


@app.command()
def delete(
    paths: list[str] = typer.Option(..., "-f", "--filename", help="Manifest file or directory (repeatable)."),
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    output: str = typer.Option("table", "--output", "-o", help="table or json."),
) -> None:
    """Delete the objects in the files from the bus: claims are released, classes and slices withdrawn."""
    from dralloc.client.submit import delete_paths

    _publish_files(lambda report: delete_paths(paths, nats_url, report), output)


def _publish_files(run: Callable[[Callable[[str], None]], Coroutine[Any, Any, Any]], output: str) -> Any:
    """Run a submit or delete (`run(report)`), print its problems and its table or JSON; exit 1
    when the bus cannot be reached, 2 when some input was bad. Returns the submission."""
    import asyncio

    from dralloc.bus import BusError
    from dralloc.client.submit import render

    if output not in ("table", "json"):
        fail(f"--output must be table or json, not {output!r}")
    problems: list[str] = []
    try:
        submission = asyncio.run(run(problems.append))
    except BusError as exc:
        fail(str(exc), 1)
    for problem in problems:
        print(f"dralloc: {problem}", file=sys.stderr)
    render(submission, output)
    if problems:
        raise typer.Exit(2)
    return submission


get_app = typer.Typer(cls=Group, rich_markup_mode=None, help="Show state kept on the bus.", no_args_is_help=True)
app.add_typer(get_app, name="get")


_GET_OUTPUT_HELP = "table (default), wide, json, yaml or name."


def _get(
    kind: str, name: str | None, namespace: str | None, all_namespaces: bool, output: str, watch: bool, nats_url: str | None, bucket: str | None = None
) -> None:
    """Shared by the `get` commands: fetch from the bus, print, or exit 1 (bus, not found) / 2 (bad argument)."""
    import asyncio

    from dralloc.bus import BusError
    from dralloc.client.get import GetError, console_for, run_get

    if all_namespaces and namespace is not None:
        fail("-n/--namespace and -A/--all-namespaces exclude each other")
    if watch and output not in ("table", "wide"):
        fail("--watch prints tables: use -o table or -o wide")
    console = console_for(sys.stdout.isatty())
    warn = lambda line: typer.echo(f"warning: {line}", err=True)  # noqa: E731 - one bad record never breaks a listing
    try:
        asyncio.run(run_get(nats_url, kind, name, namespace=namespace, output=output, console=console, watch=watch, bucket=bucket, warn=warn))
    except GetError as exc:
        fail(f"get {kind}: {exc}", 1 if "not found" in str(exc) else 2)
    except BusError as exc:
        fail(str(exc), 1)


@get_app.command("claims")
def get_claims(
    name: str = typer.Argument(None, metavar="NAME", show_default=False, hidden=True),
    namespace: str = typer.Option(None, "-n", "--namespace", metavar="NAMESPACE", help="Only claims in this namespace (default: every namespace)."),
    all_namespaces: bool = typer.Option(False, "-A", "--all-namespaces", help="Every namespace (the default; for kubectl habits)."),
    output: str = typer.Option("table", "--output", "-o", metavar="FORMAT", help=_GET_OUTPUT_HELP),
    watch: bool = typer.Option(False, "-w", "--watch", help="After the table, print each claim whose decision changes (Ctrl-C stops)."),
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    bucket: str = typer.Option(None, "--bucket", help="KV bucket of the local store (default dralloc-claims)."),
) -> None:
    """Each claim's latest decision (status, node, devices, message, AGE since the decision) from the
    status writer's store; NAME: only that claim (name, or namespace/name)."""
    _get("claims", name, namespace, all_namespaces, output, watch, nats_url, bucket)


def _get_command(kind: str, what: str) -> None:
    def command(
        name: str = typer.Argument(None, metavar="NAME", show_default=False, hidden=True),
        output: str = typer.Option("table", "--output", "-o", metavar="FORMAT", help=_GET_OUTPUT_HELP),
        watch: bool = typer.Option(False, "-w", "--watch", help="After the table, print each row that changes (Ctrl-C stops)."),
        nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    ) -> None:
        _get(kind, name, None, False, output, watch, nats_url)

    command.__doc__ = f"{what} NAME: only that one."
    get_app.command(kind)(command)


_get_command("nodes", "Nodes with their GPUs used, partitioned (MIG) and free, fragmentation, NVLink domains; then each NVLink domain.")
_get_command("devices", "Every node-local device: kind, product, free / used / partitioned, and the claim holding it.")
_get_command("slices", "The ResourceSlices on the bus: driver, pool, node, devices, generation.")
_get_command("classes", "DeviceClasses with how many devices each matches, how many are used and free.")


@app.command()
def top(
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    once: bool = typer.Option(False, "--once", help="Print the view once and exit (also when not on a terminal)."),
) -> None:
    """A live view of the fleet: GPUs used and free by class, the most fragmented nodes and NVLink domains,
    pending claims with their reason, decisions per second. Refreshed from the bus; Ctrl-C stops."""
    import asyncio

    from rich.console import Console

    from dralloc.bus import BusError
    from dralloc.client.top import run_top

    try:
        asyncio.run(run_top(nats_url, Console(), once=once or not sys.stdout.isatty()))
    except BusError as exc:
        fail(str(exc), 1)


@get_app.command("deadletters")
def get_deadletters(
    nats_url: str = typer.Option(None, "--nats-url", help=NATS_URL_HELP),
    limit: int = typer.Option(50, "--limit", help="Show at most this many, the most recent."),
    output: str = typer.Option("table", "--output", "-o", help="table or json."),
) -> None:
    """Messages a service could never process (undecodable, invalid, or failing every time), with the reason."""
    import asyncio

    from dralloc.bus import Bus, BusError

    if output not in ("table", "json"):
        fail(f"--output must be table or json, not {output!r}")

    async def fetch():
        async with await Bus.connect(nats_url, name="get") as bus:
            await bus.ensure_streams()
            return await bus.dead_letters(limit)

    try:
        letters = asyncio.run(fetch())
    except BusError as exc:
        fail(str(exc), 1)
    if output == "json":
        import msgspec

        print(msgspec.json.format(msgspec.json.encode({"deadLetters": letters}), indent=2).decode())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("SEQ", "CONSUMER", "SUBJECT", "REASON", box=None, header_style="bold", caption=f"{len(letters)} dead letters")
    for d in letters:
        table.add_row(str(d.sequence), f"{d.stream}/{d.consumer}", d.subject, d.reason)
    Console().print(table)


@app.command()
def demo(
    examples: list[str] = typer.Option([], "-f", "--filename", help="Manifests to apply (default: the project's examples/)."),
    fleet: str = typer.Option(None, "--fleet", help="Fleet of simulated nodes: a fleet file (default: 4 H100 + 2 L40S nodes)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Without a terminal: give up waiting for decisions after this many seconds."),
) -> None:
    """The whole system in one process: private nats-server, the four services, a simulated cluster, the examples.

    On a terminal it shows allocations as they commit and runs until Ctrl-C;
    otherwise it prints the final table and exits. Leaves no process or file behind.
    """
    import asyncio

    from dralloc.bus import BusError
    from dralloc.demo import DemoError, run_demo

    try:
        code = asyncio.run(run_demo(examples or None, fleet, timeout=timeout))
    except (BusError, DemoError) as exc:
        fail(str(exc), 1)
    except asyncio.CancelledError:  # interrupted by a signal; everything was cleaned up
        raise typer.Exit(130) from None
    raise typer.Exit(code)


schemas_app = typer.Typer(cls=Group, rich_markup_mode=None, help="The bus contract as language-neutral files.", no_args_is_help=True)
app.add_typer(schemas_app, name="schemas")


@schemas_app.command("export")
def schemas_export(
    out: str = typer.Option(None, "--out", help="Directory to write (default: the package's schemas/ directory)."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if the files differ from the code."),
) -> None:
    """Write JSON Schema per event (jsonschema/*.json) and the AsyncAPI 3 document (asyncapi.yaml)."""
    from dralloc.schemas.export import default_dir, drift, write

    target = out or str(default_dir())
    if check:
        stale = drift(target)
        for name in stale:
            print(f"dralloc: {name} differs from the code; run `dralloc schemas export`", file=sys.stderr)
        raise typer.Exit(1 if stale else 0)
    for path in write(target):
        print(path)


# --- the engine offline: allocate, explain -----------------------------------------

_OUTPUTS = ("json", "yaml", "table")


_PROFILE_HELP = "Add COUNT (default 1) simulated nodes of a hardware profile, named <profile>-<i> (repeatable; see `dralloc discover --list-profiles`)."
_FLEET_HELP = "Add the simulated nodes of a fleet file (the demo's format)."


def _offline(paths: list[str], node: str | None, together: bool, output: str | None, explain: bool, profiles: Sequence[str] = (), fleet: str | None = None):
    """Shared by allocate and explain: read, allocate, or exit 2 with one clear message."""
    from dralloc.allocator.offline import InputError, run
    from dralloc.simulated import SimulatedNodesError, simulated_objects

    if output is not None and output not in _OUTPUTS:
        fail(f"--output must be one of {', '.join(_OUTPUTS)}, not {output!r}")
    try:
        extra = simulated_objects(profiles, fleet)
        result = run(paths, node=node, together=together, explain=explain, extra=extra)
    except (InputError, SimulatedNodesError) as exc:
        fail(str(exc))
    for warning in result.warnings:
        print(f"dralloc: warning: {warning}", file=sys.stderr)
    return result, output or ("table" if sys.stdout.isatty() else "json")


@app.command()
def allocate(
    paths: list[str] = typer.Option([], "-f", "--filename", help="Manifest file or directory (repeatable)."),
    node: str = typer.Option(None, "--node", help="Only consider this node."),
    together: bool = typer.Option(False, "--together", help="All pending claims as one all-or-nothing unit on one node."),
    output: str = typer.Option(None, "-o", "--output", help="json, yaml or table (default: table on a terminal, else json)."),
    profile: list[str] = typer.Option([], "--profile", metavar="NAME[:COUNT]", help=_PROFILE_HELP),
    fleet: str = typer.Option(None, "--fleet", metavar="FILE", help=_FLEET_HELP),
) -> None:
    """Allocate the pending ResourceClaims, Pods and workloads in the inputs (see CLI-CONTRACT.md and the README).
    Exit 0: all allocated; 1: some not; 2: bad input."""
    from rich.console import Console

    from dralloc.allocator.explain import render_allocate
    from dralloc.allocator.offline import exit_code

    result, output = _offline(paths, node, together, output, explain=False, profiles=profile, fleet=fleet)
    render_allocate(result.outcomes, output, Console(soft_wrap=True), result.pods)
    raise typer.Exit(exit_code(result.outcomes))


@app.command()
def explain(
    paths: list[str] = typer.Option([], "-f", "--filename", help="Manifest file or directory (repeatable)."),
    claim: str = typer.Option(None, "--claim", help="Only this claim (namespace/name)."),
    node: str = typer.Option(None, "--node", help="Only consider this node."),
    together: bool = typer.Option(False, "--together", help="All pending claims as one all-or-nothing unit on one node."),
    output: str = typer.Option(None, "-o", "--output", help="table (default on a terminal), json or yaml."),
    profile: list[str] = typer.Option([], "--profile", metavar="NAME[:COUNT]", help=_PROFILE_HELP),
    fleet: str = typer.Option(None, "--fleet", metavar="FILE", help=_FLEET_HELP),
) -> None:
    """Why each claim got its devices, or why not: per request, how many devices each filter left
    (pool, class, selectors, node, in use, counters, capacity, taints, constraints) and which filter
    emptied the set.

    CEL runtime errors: a selector that fails at run time on a device the request could otherwise take
    on a node (reachable, in a usable pool, not held exclusively by another claim unless the request has
    admin access or asks for All) makes that node unusable for the claim: an error with --node; when the
    engine picks the node, an error only if no node without such failures fits. The verdict never
    depends on the order the search visits devices in.
    """
    from rich.console import Console

    from dralloc.allocator.explain import render_explain
    from dralloc.allocator.offline import exit_code

    result, output = _offline(paths, node, together, output, explain=True, profiles=profile, fleet=fleet)
    outcomes = result.outcomes
    if claim is not None:
        key = claim if "/" in claim else f"default/{claim}"
        outcomes = [o for o in outcomes if o.claim == key]
        if not outcomes:
            fail(f"no pending claim {key} in the inputs")
    render_explain(outcomes, output, Console(soft_wrap=True), result.holders, result.pods)
    raise typer.Exit(exit_code(outcomes))


@app.command()
def lint(
    paths: list[str] = typer.Option(..., "-f", "--filename", help="Manifest file or directory (repeatable)."),
    output: str = typer.Option("text", "-o", "--output", help="text or json."),
) -> None:
    """Check manifests without a running system: schema, API validation, CEL against the device
    environment (with corrected expressions), and references between the given objects.
    Exit 0: no problem; 1: problems found (all listed)."""
    import json

    from dralloc.lint import lint as lint_manifests
    from dralloc.lint import lint_warnings, workload_count
    from dralloc.manifests import load_paths

    if output not in ("text", "json"):
        fail(f"--output must be text or json, not {output!r}")
    manifests = load_paths(paths)
    problems = lint_manifests(manifests)
    warnings = lint_warnings(manifests, paths)
    if output == "json":
        print(json.dumps({"problems": [p.as_json() for p in problems], "warnings": warnings}, indent=2))
    else:
        for warning in warnings:
            print(f"dralloc: warning: {warning}", file=sys.stderr)
        for problem in problems:
            print(problem, end="\n\n")
        checked = len(manifests.objects) + workload_count(manifests)
        print(f"{checked} object(s) checked, {len(problems)} problem(s)")
    raise typer.Exit(1 if problems else 0)


@app.command()
def migrate(
    paths: list[str] = typer.Option(..., "-f", "--filename", help="Manifest file, directory, or - for standard input (repeatable)."),
    output: str = typer.Option("yaml", "-o", "--output", help="yaml (default), diff or json."),
    in_place: bool = typer.Option(False, "--in-place", help="Rewrite the files; print nothing."),
    usage: str = typer.Option(None, "--usage", help="CSV of DCGM peak memory (MiB) and utilisation (%) per container: right-size to MIG."),
    keep_node_selectors: bool = typer.Option(False, "--keep-node-selectors", help="Keep the GPU Feature Discovery labels on the pod too."),
) -> None:
    """Rewrite nvidia.com/gpu, MIG and time-slicing requests as ResourceClaimTemplates (see MIGRATE-CONTRACT.md).
    Exit 0: all migrated; 1: something left (stderr says what and why); 2: bad input."""
    from dralloc.manifests import read_text
    from dralloc.migrate.command import InputError, run

    try:
        stdin_text = read_text(sys.stdin.buffer) if "-" in paths else None
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"<stdin>: cannot read: {exc}")
    try:
        result = run(paths, output=output, in_place=in_place, usage_path=usage, keep_node_selectors=keep_node_selectors, stdin_text=stdin_text)
    except InputError as exc:
        fail(str(exc))
    for path, text in result.writes.items():
        try:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            fail(f"{path}: cannot write: {exc.strerror or exc}")
    sys.stdout.write(result.stdout)
    for line in result.report.changes:
        print(f"dralloc: right-size: {line}", file=sys.stderr)
    for line in result.report.warnings:
        print(f"dralloc: warning: {line}", file=sys.stderr)
    for line in result.report.problems:
        print(f"dralloc: not migrated: {line}", file=sys.stderr)
    raise typer.Exit(result.exit_code)


@app.command()
def plan(
    paths: list[str] = typer.Option(..., "-f", "--filename", help="Workload manifests: files or directories (repeatable)."),
    fleet: str = typer.Option(..., "--fleet", help="Fleet file of simulated nodes (the demo's format)."),
    usage: str = typer.Option(None, "--usage", help="CSV of DCGM peaks per container (see `dralloc migrate --usage`): right-size under DRA."),
    output: str = typer.Option("table", "-o", "--output", help="table, json, png or svg (a chart: needs dralloc[plot])."),
    as_json: bool = typer.Option(False, "--json", help="Same as -o json."),
    chart_file: str = typer.Option(None, "--chart-file", help="Where -o png|svg writes the chart (default dralloc-plan.<png|svg>)."),
) -> None:
    """GPUs and nodes the workloads need under the device plugin (whole GPUs, first fit) and under DRA with
    dralloc's placement (MIG, right-sizing, topology), from the same engine, and which workloads drive the
    difference. Exit 0: every pod fits in both modes; 1: some did not fit; 2: bad input."""
    import json

    from rich.console import Console

    from dralloc.migrate.documents import InputError
    from dralloc.migrate.plan import plan as run_plan
    from dralloc.migrate.plan_render import PlotUnavailable, chart, table

    output = "json" if as_json else output
    if output not in ("table", "json", "png", "svg"):
        fail(f"--output must be table, json, png or svg, not {output!r}")
    try:
        result, report = run_plan(paths, fleet, usage)
    except InputError as exc:
        fail(str(exc))
    for line in report.changes:
        print(f"dralloc: right-size: {line}", file=sys.stderr)
    for line in report.problems:
        print(f"dralloc: not planned: {line}", file=sys.stderr)
    if output == "json":
        print(json.dumps(result, indent=2))
    else:
        table(result, Console(soft_wrap=True))
    if output in ("png", "svg"):
        target = chart_file or f"dralloc-plan.{output}"
        try:
            chart(result, target, output)
        except PlotUnavailable as exc:
            fail(str(exc), 1)
        except OSError as exc:
            fail(f"{target}: cannot write: {exc.strerror or exc}")
        print(f"chart written to {target}", file=sys.stderr)
    raise typer.Exit(1 if result["not_fitted_device_plugin"] or result["not_fitted_dra"] else 0)


# --- benchmarks -----------------------------------------------------------------------

bench_app = typer.Typer(
    cls=Group, rich_markup_mode=None, help="Benchmarks: workloads built in memory, numbers reported (never asserted).", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")


def _benchmarks_module(name: str):
    """A checkout's benchmarks/: beside the package (the editable install), else in the working
    directory when it is a dralloc checkout (a copied install, e.g. the native build, run from the
    checkout). Any other directory's benchmarks/ is not run: it is code, and the directory may be anyone's."""
    import importlib.util
    from pathlib import Path

    beside = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    cwd = Path.cwd()
    checkout = (cwd / "setup.py").is_file() and (cwd / "services" / "allocator" / "engine").is_dir()
    path = beside if beside.is_file() or not checkout else cwd / "benchmarks" / f"{name}.py"
    if not path.is_file():
        fail(f"{beside} not found{'' if path == beside else f', nor {path}'}: benchmarks run from a dralloc repository checkout")
    spec = importlib.util.spec_from_file_location(f"dralloc_benchmarks_{name}", path)
    if spec is None or spec.loader is None:
        fail(f"{path}: not loadable as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _print_bench(result: dict, as_json: bool, title: str, rows: Sequence[tuple[str, ...]], columns: tuple[str, ...] = ("value",)) -> None:
    """One stable JSON object for machines, or a table of `rows` (metric, value per column) for people."""
    if as_json:
        import json

        print(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


@bench_app.command("engine")
def bench_engine(
    workload: str = typer.Option(..., "--workload", help="kube-perf-500 (Kubernetes-comparable), gpu-fleet-10k, churn-mixed or frontier-250k."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    scoring: bool = typer.Option(True, "--scoring/--first-fit", help="Topology/best-fit placement (default) or Kubernetes' first-fit order."),
    seed: int = typer.Option(7, "--seed", help="Seed of the workload's random choices (named in the output)."),
    nodes: int = typer.Option(0, "--nodes", help="frontier-250k only: the same mix on this many nodes (0: 31,250)."),
) -> None:
    """Allocate a workload's claims one by one through the engine: claims/s, p50/p99 latency, peak RSS, cold start;
    then what its CEL selectors cost per device and what refusing a cost bomb takes (`cel`)."""
    module = _benchmarks_module("engine_workloads")
    if workload not in module.WORKLOADS:
        fail(f"unknown workload {workload!r}; known: {', '.join(module.WORKLOADS)}")
    if nodes and (workload != "frontier-250k" or not 19 <= nodes <= 100_000):
        fail("--nodes goes with --workload frontier-250k, from 19 to 100000")
    built = module.frontier(nodes=nodes, seed=seed) if nodes else None
    result = module.measure(workload, scoring=scoring, seed=seed, workload=built)
    # the table shows `cel`'s summary; each selector's row is in --json
    cel = {f"cel {k}": v for k, v in result.get("cel", {}).items() if k != "selectors"}
    rows = [(k, str(v)) for k, v in [*result.items(), *cel.items()] if k != "cel"]
    _print_bench(result, as_json, f"dralloc bench engine: {workload}", rows)


@bench_app.command("scale")
def bench_scale(
    gpus: str = typer.Option("10k,50k,250k", "--gpus", help="Fleet sizes in GPUs, comma-separated (10k = 10,000)."),
    seed: int = typer.Option(7, "--seed", help="Seed of the claims."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The frontier mix (bench engine --workload frontier-250k) at each size, each in its own process:
    how cold start, claims/s, p99 and memory per device grow with the fleet."""
    module = _benchmarks_module("engine_workloads")
    try:
        sizes = module.parse_sizes(gpus)
    except ValueError as exc:
        fail(f"--gpus {exc}")
    try:
        result = module.scale(sizes, seed=seed)
    except RuntimeError as exc:
        fail(f"bench scale: {exc}", 1)
    if as_json:
        _print_bench(result, True, "", [])
        return
    points = result["points"]
    keys = list(points[0]) if points else []
    _print_bench(result, False, f"dralloc bench scale (seed {seed})", [(k, *(str(p[k]) for p in points)) for k in keys], tuple(f"{g:,} GPUs" for g in sizes))


@bench_app.command("takeover")
def bench_takeover(
    decisions: int = typer.Option(
        100_000, "--decisions", help="Decisions in ALLOCATIONS before the standby takes over (history of released claims plus the live ones)."
    ),
    live: int = typer.Option(1000, "--live", help="Claims still allocated among them."),
    tail: int = typer.Option(
        -1,
        "--tail",
        help="Decisions written after the leader's last snapshot (default: the most the snapshot policy leaves, max(DRALLOC_ALLOCATOR_SNAPSHOT_EVERY, live) - 1).",
    ),
    snapshot: bool = typer.Option(True, "--snapshot/--no-snapshot", help="--no-snapshot: the leader writes none, the standby replays ALLOCATIONS whole."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """A standby's rebuild (its takeover, less the lease wait) after N decisions, with a real nats-server: takeover_seconds."""
    import asyncio
    from pathlib import Path

    if decisions < 1 or live < 1:
        fail("--decisions and --live must be at least 1")
    if tail < -1:
        fail("--tail must be 0 or more")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # takeover imports pipeline's helpers
    result = asyncio.run(_benchmarks_module("takeover").run(decisions, live=live, tail=None if tail == -1 else tail, snapshot=snapshot))
    _print_bench(result, as_json, f"dralloc bench takeover: {decisions} decisions", [(k, str(v)) for k, v in result.items()])


@bench_app.command("placement")
def bench_placement(
    seeds: str = typer.Option("42", "--seeds", help="Seeds of the churn trace: 42, 1-5 or 1,3,7-9."),
    loads: str = typer.Option("0.9", "--loads", help="Offered loads per GPU family, comma-separated: 1.0 offers as much GPU time as it has."),
    jobs: int = typer.Option(3000, "--jobs", help="Arrivals in each trace (claims and gangs)."),
    max_wait: float = typer.Option(30.0, "--max-wait", help="Minutes a large claim (8 GPUs, a gang) may wait for room before it is refused."),
    keep_whole: float = typer.Option(
        0.0,
        "--keep-whole",
        help="dralloc keeps round(FACTOR x recent large placements) whole nodes per node group for large claims (0: off, as the engine's default).",
    ),
    moves: bool = typer.Option(
        False,
        "--moves",
        help="Also run dralloc with moves: small claims in a waiting large claim's way restart elsewhere (from 5/6 of its wait, a gang at its end; and early).",
    ),
    move_after: float = typer.Option(0.0, "--move-after", help="With --moves: try moves this many minutes into a wait, and at its end (0: as when-refused)."),
    move_reserve: bool = typer.Option(
        True, "--move-reserve/--move-no-reserve", help="With --moves: --move-no-reserve drops reservations (waits end in moves)."
    ),
    move_by_lost: bool = typer.Option(False, "--move-by-lost", help="With --moves: of targets moving as many claims, the one whose claims served least."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: every run and the totals."),
) -> None:
    """Seeded churn traces over a 68-node mixed fleet, each run with dralloc's placement, as
    Kubernetes places it (a random feasible node, devices first fit) and with first fit by node
    rank, with the same waiting rules: refusals, refusals with enough free GPUs, waits of large
    claims, small claims refused, utilization, GPU-hours served, locality."""
    module = _benchmarks_module("placement")
    try:
        seed_list, load_list = module.parse_seeds(seeds), module.parse_loads(loads)
    except ValueError as exc:
        fail(f"bench placement: {exc}")
    if jobs < 1 or max_wait < 0 or not 0 <= keep_whole <= 10 or move_after < 0:
        fail("--jobs must be at least 1, --max-wait and --move-after not negative and --keep-whole in [0, 10]")
    levers: dict = {}  # only the levers changed from dralloc_moves as shipped (echoed as move_levers)
    if move_after:
        levers["move_after"] = move_after
    if not move_reserve:
        levers["reserve"] = False
    if move_by_lost:
        levers["by_lost"] = True
    result = module.measure(seed_list, load_list, jobs=jobs, max_wait=max_wait, keep_whole=keep_whole, moves=moves, levers=levers)
    if as_json:
        _print_bench(result, True, "", [])
        return
    policies = module.policies(moves)
    # the table shows numbers (module.table_numbers); the per-refusal descriptions are in --json
    keys = list(module.table_numbers(result["runs"][0][policies[-1]])) if result["runs"] else []
    for run_ in result["runs"]:
        title = f"dralloc bench placement: seed {run_['seed']}, load {run_['load']} ({run_['units']} arrivals, {run_['large_claims']} large)"
        cells = {p: module.table_numbers(run_[p]) for p in policies}
        _print_bench(run_, False, title, [(k, *(str(cells[p].get(k, "")) for p in policies)) for k in keys], policies)
    totals = result["totals"]
    cells = {p: module.table_numbers(totals[p]) for p in policies}
    rows = [(k, *(str(cells[p].get(k, "")) for p in policies)) for k in cells[policies[-1]]]
    # each of ours (dralloc, and with --moves its move policies) against each comparator, in our column
    comparators = ("kubernetes", "first_fit")
    for mine in (p for p in policies if p not in comparators):
        for other in comparators:
            versus = totals[f"vs_{other}" if mine == "dralloc" else f"{mine}_vs_{other}"]
            rows += [(f"{k} vs {other}", *(str(versus[k]) if p == mine else "" for p in policies)) for k in versus]
    _print_bench(totals, False, f"dralloc bench placement: totals over {totals['runs']} runs (max wait {max_wait} min)", rows, policies)


@bench_app.command("pipeline")
def bench_pipeline(
    rate: float = typer.Option(1000.0, "--rate", help="Claims offered per second in the latency phase."),
    duration: float = typer.Option(5.0, "--duration", help="Seconds of the latency phase."),
    sustain_rate: float = typer.Option(4000.0, "--sustain-rate", help="Claims offered per second in the throughput phase (above capacity: a backlog grows)."),
    sustain: float = typer.Option(5.0, "--sustain", help="Seconds of the throughput phase; claims/s is over its last three quarters."),
    mig_every: int = typer.Option(10, "--mig-every", help="Every Nth claim asks for a MIG slice (1g.18gb of an H200) instead of a whole H100; 0: none."),
    ceiling: int = typer.Option(20000, "--ceiling", help="Messages through the bus-only chain (the ceiling) after the pipeline; 0: not measured."),
    burst: int = typer.Option(4000, "--burst", help="With --chaos: claims offered at once after the latency phase."),
    chaos: bool = typer.Option(False, "--chaos", help="kill -9 the active allocator and restart nats-server at intervals; check the invariants."),
    kill_every: float = typer.Option(3.0, "--kill-every", help="With --chaos: seconds between kills of the active allocator."),
    restart_every: float = typer.Option(7.0, "--restart-every", help="With --chaos: seconds between nats-server restarts."),
    allocators: int = typer.Option(1, "--allocators", help="Allocator processes (at least 2 with --chaos)."),
    hostile: bool = typer.Option(
        False,
        "--hostile",
        help="Under infra/nats/auth.conf, send a fixed hostile corpus (benchmarks/hostile.py) interleaved with valid claims; report what got through.",
    ),
    cluster: int = typer.Option(
        1, "--cluster", help="nats-servers: 3 runs a JetStream cluster on loopback (R3 streams; --chaos restarts one server at a time)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """nats-server and the four services as separate processes, claims sent through the submit path
    (manifest files, as `dralloc submit` reads them) to a fleet with MIG nodes: p50/p99 from each
    claim's offer to the status writer's stored record at --rate, claims/s over a sustained window at
    --sustain-rate, the bus-only ceiling of the same chain and the ratio; with --chaos (claims
    published directly, then a burst) submitted, outcomes, lost, duplicated,
    double_allocated_devices; with --hostile hostile_sent,
    valid_submitted, valid_decided, max_stall_s, lost, duplicated, double_allocated_devices, services_restarted."""
    import asyncio
    import logging

    from dralloc.bus import BusError

    if rate <= 0 or duration <= 0 or sustain_rate <= 0 or sustain <= 0 or burst < 2 or allocators < 1 or not 1 <= cluster <= 5:
        fail("--rate, --duration, --sustain-rate and --sustain must be positive, --burst at least 2, --allocators at least 1, --cluster 1 to 5")
    if mig_every < 0 or ceiling < 0:
        fail("--mig-every and --ceiling must be 0 or more")
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)  # NATS restarts under --chaos are expected, not news
    if hostile:
        try:
            result = asyncio.run(_benchmarks_module("hostile").run(cluster=cluster))
        except (BusError, TimeoutError, RuntimeError) as exc:
            fail(f"bench pipeline --hostile: {exc or 'the system did not get ready in time'}", 1)
        rows = [(key, str(value)) for key, value in result.items() if key != "problems"]
        _print_bench(result, as_json, "dralloc bench pipeline --hostile", rows)
        return
    module = _benchmarks_module("pipeline")
    options = module.Options(
        rate=rate,
        duration=duration,
        burst=burst,
        chaos=chaos,
        kill_every=kill_every,
        restart_every=restart_every,
        allocators=allocators,
        cluster=cluster,
        sustain_rate=sustain_rate,
        sustain=sustain,
        mig_every=mig_every,
        ceiling=ceiling,
    )
    try:
        result = asyncio.run(module.run(options))
    except (BusError, TimeoutError) as exc:
        fail(f"bench pipeline: {exc or 'the system did not get ready in time'}", 1)
    _print_bench(result, as_json, "dralloc bench pipeline" + (" --chaos" if chaos else ""), list(module.summary_rows(result)))


def main() -> None:
    try:
        app()
    except UsageError as exc:
        print(f"dralloc: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
