import pytest

from dralloc.bus import Bus, embedded_nats


@pytest.fixture
async def bus():
    """A private nats-server with the dralloc streams, and a connection to it."""
    async with embedded_nats() as url:
        connection = await Bus.connect(url, name="test")
        await connection.ensure_streams()
        try:
            yield connection
        finally:
            await connection.close()
