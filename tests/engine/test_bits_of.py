"""`bits_of` builds a bitset from device ids in one pass (#17: it is built from the lowest id up
and shifted, so a node's few ids near the top of a 250,000-GPU fleet's range no longer make a
fleet-sized buffer); it must be the set bits of exactly those ids, wherever they lie."""

from __future__ import annotations

import random

from dralloc.allocator.engine.inventory import bits_of, iter_bits


def test_bits_of_is_the_ids_set_bits_low_high_sparse_and_repeated():
    rng = random.Random(5)
    assert bits_of([]) == 0
    assert bits_of([0]) == 1
    assert bits_of([7, 8]) == 0b1_1000_0000
    for _ in range(200):
        top = rng.choice([8, 64, 5_000, 300_000])
        low = rng.randrange(top)
        ids = [rng.randrange(low, min(top, low + rng.choice([1, 9, 300]))) for _ in range(rng.randrange(1, 12))]
        rng.shuffle(ids)
        bits = bits_of(ids)
        assert bits == sum(1 << i for i in set(ids))
        assert list(iter_bits(bits)) == sorted(set(ids))
