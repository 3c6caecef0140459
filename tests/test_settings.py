"""dralloc.settings: what every service's Config.from_env shares (switches, seconds, flags over variables)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from dralloc.settings import env_flag, env_seconds, overridden


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("true", True), (" YES ", True), ("On", True), ("0", False), ("false", False), ("", False), ("maybe", False)]
)
def test_a_switch_is_on_only_when_it_says_so(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("DRALLOC_TEST_SWITCH", value)
    assert env_flag("DRALLOC_TEST_SWITCH", default=not expected) is expected


def test_an_unset_switch_is_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRALLOC_TEST_SWITCH", raising=False)
    assert env_flag("DRALLOC_TEST_SWITCH", default=True) is True
    assert env_flag("DRALLOC_TEST_SWITCH") is False


def test_seconds_are_a_number_or_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRALLOC_TEST_SECONDS", raising=False)
    assert env_seconds("DRALLOC_TEST_SECONDS", 2.5) == 2.5
    monkeypatch.setenv("DRALLOC_TEST_SECONDS", "0.25")
    assert env_seconds("DRALLOC_TEST_SECONDS", 2.5) == 0.25
    monkeypatch.setenv("DRALLOC_TEST_SECONDS", "soon" + "x" * 100)
    with pytest.raises(ValueError, match=r"^DRALLOC_TEST_SECONDS must be a number of seconds, not 'soonx+'$") as caught:
        env_seconds("DRALLOC_TEST_SECONDS", 2.5)
    assert len(str(caught.value)) < 120  # a hostile value is cut short, not echoed whole


@dataclass
class Settings:
    source: str = "files"
    paths: list[str] = field(default_factory=lambda: ["from-env"])
    watch: bool = True


def test_flags_given_override_the_environment_and_unset_ones_do_not() -> None:
    config = Settings()
    assert overridden(config, {"source": "kubernetes", "paths": [], "watch": None}) is config
    assert config == Settings(source="kubernetes", paths=["from-env"], watch=True)
    assert overridden(Settings(), {"paths": ["a.yaml"], "watch": False}) == Settings(paths=["a.yaml"], watch=False)


def test_an_unknown_setting_is_a_callers_mistake() -> None:
    with pytest.raises(TypeError, match="Settings has no setting 'sorce'"):
        overridden(Settings(), {"sorce": "files"})
