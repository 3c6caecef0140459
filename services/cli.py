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


def main() -> None:
    try:
        app()
    except UsageError as exc:
        print(f"dralloc: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
