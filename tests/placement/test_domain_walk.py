"""Best fit's walk over multi-node domains (GB200 NVL72 racks) ends with its candidates: a claim
whose candidates are in the first racks of the order reads no other rack (at 250,000 GPUs the walk
over all 100 racks, a bitset operation as wide as the fleet each, was most of a claim's time)."""

from __future__ import annotations

import pytest
from conftest import claim, make_engine


class _Reads(dict):
    """A domain -> node ranks map that counts the domains read."""

    read: list[str]

    def __getitem__(self, domain: str) -> int:
        self.read.append(domain)
        return super().__getitem__(domain)


def _count_reads(engine) -> list[str]:
    topology = engine.placement.topology
    bits = _Reads(topology.domain_bits())
    bits.read = []
    topology.domain_bits = lambda label=None: bits
    return bits.read


@pytest.mark.interpreted
def test_a_claim_in_the_fullest_rack_reads_only_that_rack():
    engine = make_engine([("gb200-nvl72", 54)])
    assert engine.allocate([claim("first", 1)])[0].node == "gb200-nvl72-0"
    read = _count_reads(engine)
    # the partly used tray of rack 0 first (best fit), then no other rack
    assert engine.allocate([claim("second", 1)])[0].node == "gb200-nvl72-0"
    assert len(set(read)) == 1
