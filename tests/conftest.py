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


@pytest.fixture
async def nats_url():
    """A private nats-server (real, free port, temp dir, JetStream), stopped and removed afterwards."""
    from dralloc.bus import embedded_nats

    async with embedded_nats() as url:
        yield url


@pytest.fixture
async def bus(nats_url):
    """A connection to the private nats-server, with the dralloc streams created."""
    from dralloc.bus import Bus

    connection = await Bus.connect(nats_url, name="test")
    await connection.ensure_streams()
    try:
        yield connection
    finally:
        await connection.close()
