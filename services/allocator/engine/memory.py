"""Garbage-collector policy for a process that keeps a loaded engine for long (the allocator).

The inventory and the ledger are millions of long-lived objects; CPython's cyclic collector
walks them again on every full collection (on 9,904 GPUs, ~10% of the allocator's time and
pauses of tens of ms), and a decision's own objects are freed by reference counting long
before a young collection would find them.

What is frozen is never collected, and an engine is cyclic (its inventory's callbacks point at
its topology, which points back): a term's engine, dropped when the term ends, stayed in memory
for the life of the process, one fleet's worth per term (`release_term`).
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_EVERY = 20_000
"""Allocations between young collections (CPython's default: 700)."""


def freeze_long_lived() -> None:
    """Move what is alive now (the loaded engine) out of the cyclic collector's sight and make
    young collections rarer.

    No full collection first: it walks every object of the loaded fleet (2.6 s CPU of cold start
    at 100,000 GPUs, frontier mix), and the load, run with the collector off, leaves no
    cyclic garbage for it to find (0 objects at 3,000 frontier nodes). What little a term's
    start might leave is frozen with the engine: a bounded, one-time cost."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


def release_term() -> int:
    """Once a term has ended and its engine is dropped: let the collector see again what the term
    froze (`freeze_long_lived`, and retry.py after each inventory burst) and collect it; the number
    of unreachable objects found. A full collection, over the dropped engine: paid between terms,
    not by the next term's rebuild (the next engine does not exist yet)."""
    gc.unfreeze()
    return gc.collect()
