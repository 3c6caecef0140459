import pytest

from dralloc.bus import Bus, embedded_nats


@pytest.fixture
async def bus():
    """A connection to a private nats-server (real, on a free port) with the dralloc streams."""
    async with embedded_nats() as url:
        connection = await Bus.connect(url, name="discovery-test")
        await connection.ensure_streams()
        try:
            yield connection
        finally:
            await connection.close()
