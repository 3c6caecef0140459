import pytest

from dralloc.bus import Bus, embedded_nats


@pytest.fixture
async def nats_url():
    async with embedded_nats() as url:
        yield url


@pytest.fixture
async def bus(nats_url):
    """A connection to a private nats-server with the dralloc streams."""
    connection = await Bus.connect(nats_url, name="test")
    await connection.ensure_streams()
    try:
        yield connection
    finally:
        await connection.close()
