"""Help text as kubectl users read it: plain columns, a value name for each option, none for a flag.

Typer labels every option with its Python type (`<bool>`, `<list[str]>`,
`<str>`); dralloc's command groups use `Group`, which names each value after
its option (`--node NODE`, `--output OUTPUT`) unless the option sets its own
metavar, and shows flags bare.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup, TyperOption


def tidy(command: Any) -> Any:
    """Give every option of `command` without a metavar one: none for a flag, else its long name in capitals."""
    for param in command.params:
        if not isinstance(param, TyperOption) or param.metavar is not None:
            continue
        if param.is_flag or param.count:
            param.metavar = ""
            continue
        longest = max(param.opts, key=len).lstrip("-")
        param.metavar = longest.replace("-", "_").upper()
    return command


class Group(TyperGroup):
    """A command group whose commands' options get tidy value names (see `tidy`)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return tidy(command) if command is not None else None
