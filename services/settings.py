"""A service's settings as `Config.from_env(**overrides)` builds them (all four services): the
``DRALLOC_*`` variables first, then the flags given on the command line over them.

The parts every service's `from_env` had a copy of live here: reading a switch and a number of
seconds from the environment, and laying the given flags over the result.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # (typeshed's protocol of a dataclass instance: types only)

TRUE = ("1", "true", "yes", "on")
"""What a switch variable says to mean on (any case, surrounding spaces ignored); anything else is off."""

C = TypeVar("C", bound="DataclassInstance")
L = TypeVar("L", bound=str)


def one_of(value: str, choices: Sequence[L], what: str) -> L:
    """`value` as the one of `choices` it is (typed as they are, e.g. a Literal); ValueError naming
    `what`, the value (cut short) and the choices when it is none of them."""
    for choice in choices:
        if value == choice:
            return choice
    raise ValueError(f"unknown {what} {value[:40]!r}: use {' or '.join(choices)}")


def env_flag(name: str, default: bool = False) -> bool:
    """The switch variable `name` (`TRUE` or not), `default` when it is unset."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in TRUE


def env_seconds(name: str, default: float) -> float:
    """The variable `name` as a number of seconds, `default` when unset; ValueError naming it (and
    what it holds, cut short) when it is not a number."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {value[:40]!r}") from None


def overridden(config: C, overrides: dict[str, Any]) -> C:
    """`config` (a dataclass instance, changed in place and returned) with each flag that was given
    set on it: a flag left unset arrives as None, or [] for a repeatable one, and leaves what the
    environment said. A name `config` has no field for raises TypeError (a caller's mistake, not
    a user's)."""
    fields = {field.name for field in dataclasses.fields(config)}
    for key, value in overrides.items():
        if key not in fields:
            raise TypeError(f"{type(config).__name__} has no setting {key!r}")
        if value is not None and value != []:
            setattr(config, key, value)
    return config
