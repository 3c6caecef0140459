"""The allocator's settings from the environment (allocator/config.py): a malformed value stops
the service at start naming the variable; a good one is taken (the engine's side of keep-whole:
tests/placement/test_keep_whole.py)."""

from __future__ import annotations

import pytest

from dralloc.allocator.config import Config


@pytest.mark.parametrize("value", ["-0.1", "11", "nan", "inf", "ten", "", "1e400", "٣"])
def test_a_malformed_keep_whole_factor_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("DRALLOC_ALLOCATOR_KEEP_WHOLE", value)
    with pytest.raises(ValueError, match=r"DRALLOC_ALLOCATOR_KEEP_WHOLE must be a factor in \[0, 10\]"):
        Config.from_env()


def test_keep_whole_is_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRALLOC_ALLOCATOR_KEEP_WHOLE", raising=False)
    assert Config.from_env().keep_whole == 0.0
    monkeypatch.setenv("DRALLOC_ALLOCATOR_KEEP_WHOLE", "0.3")
    assert Config.from_env().keep_whole == 0.3
