"""`dralloc`: the command line.

Each command is a thin shell: read arguments, call the module that does the
work, print for people (rich tables) or machines (stable JSON). Commands
import their implementation lazily so that `dralloc --help` stays fast.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

app = typer.Typer(
    name="dralloc",
    help="Kubernetes DRA (resource.k8s.io/v1) device allocation over NATS JetStream.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class UsageError(Exception):
    """A user mistake the CLI reports in one line (exit 2), never as a traceback."""


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"dralloc: {message}", file=sys.stderr)
    raise typer.Exit(code)


@app.callback()
def _root() -> None:
    """Kubernetes DRA (resource.k8s.io/v1) device allocation over NATS JetStream."""
    # A callback keeps `dralloc` a command group even while it has one command.


@app.command()
def discover(
    profile: str = typer.Option(None, "--profile", help="Simulate a node of this hardware profile (see --list-profiles)."),
    replay: str = typer.Option(None, "--replay", help="Answer NVML queries from a captured inventory JSON."),
    node: str = typer.Option(None, "--node", help="Node name (default: $NODE_NAME, else the hostname)."),
    layout: str = typer.Option("1.35", "--layout", help="ResourceSlice layout: 1.35 (separate counter slices) or 1.34."),
    mig: bool = typer.Option(True, "--mig/--no-mig", help="Publish MIG-capable GPUs as partitionable devices."),
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
    if output not in OUTPUTS:
        fail(f"--output must be one of {', '.join(OUTPUTS)}, not {output!r}")
    if layout not in LAYOUTS:
        fail(f"--layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    try:
        inventory = inventory_from(profile=profile, replay=replay, node=node or default_node_name(), mig=mig)
    except NvmlUnavailable as exc:
        fail(f"{exc}. No NVIDIA GPU is usable here; use --profile NAME to simulate one, or --replay FILE.", 1)
    except (ReplayError, ValueError) as exc:
        fail(str(exc))
    print(render(build_slices(inventory, layout=layout), output))


def main() -> None:
    try:
        app()
    except UsageError as exc:
        print(f"dralloc: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
