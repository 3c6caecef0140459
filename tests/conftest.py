"""Shared test locations."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: fixtures, examples, the upstream corpus."""
    assert SHARED.is_dir(), f"{SHARED} is missing: the tests read ../shared from the repository root"
    return SHARED
