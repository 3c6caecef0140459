"""dralloc.settings: what every service's Config.from_env shares (switches, seconds, flags over variables)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from dralloc.discovery.service import Config as DiscoveryConfig
from dralloc.ingestor.service import Config as IngestorConfig
from dralloc.settings import env_flag, env_seconds, one_of, overridden
from dralloc.statuswriter.service import Config as StatusWriterConfig


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


def test_a_choice_is_one_of_its_choices_or_a_named_error() -> None:
    assert one_of("kubernetes", ("local", "kubernetes"), "sink") == "kubernetes"
    with pytest.raises(ValueError, match=r"^unknown sink 'floppy': use local or kubernetes$"):
        one_of("floppy", ("local", "kubernetes"), "sink")
    with pytest.raises(ValueError) as caught:
        one_of("x" * 10_000, ("local", "kubernetes"), "sink")  # a hostile value is cut short in the message
    assert len(str(caught.value)) < 100


def test_a_choice_given_as_a_flag_wins_over_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingestor's source, the status writer's sink, discovery's slice layout: the flag is checked,
    not the variable it overrides; the variable alone is checked when no flag is given."""
    monkeypatch.setenv("DRALLOC_INGESTOR_SOURCE", "floppy")
    monkeypatch.setenv("DRALLOC_STATUSWRITER_SINK", "floppy")
    monkeypatch.setenv("DRALLOC_DISCOVERY_LAYOUT", "0.1")
    monkeypatch.setenv("DRALLOC_DISCOVERY_SOURCE", "profile")
    assert IngestorConfig.from_env(source="files", paths=["claims.yaml"]).source == "files"
    assert StatusWriterConfig.from_env(sink="local").sink == "local"
    assert DiscoveryConfig.from_env(layout="1.34").layout == "1.34"
    with pytest.raises(ValueError, match="unknown source 'floppy'"):
        IngestorConfig.from_env(paths=["claims.yaml"])
    with pytest.raises(ValueError, match="unknown sink 'floppy'"):
        StatusWriterConfig.from_env()
    with pytest.raises(ValueError, match="unknown slice layout '0.1'"):
        DiscoveryConfig.from_env()
