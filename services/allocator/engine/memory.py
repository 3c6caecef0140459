"""Garbage-collector policy for a process that keeps a loaded engine for long (the allocator).

The inventory and the ledger are millions of long-lived objects; CPython's cyclic collector
walks them again on every full collection (on 9,904 GPUs, ~10% of the allocator's time and
pauses of tens of ms), and a decision's own objects are freed by reference counting long
before a young collection would find them.

So what is alive is frozen (`gc.freeze`: out of the collector's sight; it only moves lists, no
walk): once the term's engine is loaded, and then whenever enough new objects are alive after
engine work (`Collector.settle`: the ledger's growth, warm's entries, an inventory burst),
before a young collection would walk them and pass them on to older generations. Measured on
the pipeline bench (25,160 GPUs, gc.callbacks in the allocator, loaded): with the load frozen
alone, every young collection found nothing to collect and took 3-86 ms, the middle generation's
73-387 ms, a full one 2.3 s.

What is frozen is never collected: a cycle that was alive at a freeze and dropped later, or one
dropped just before it, stays until the collector sees it again. A full collection walks
everything (measured 1.0-2.8 s at 0.4-1.4 million objects, the pipeline's 25,000 claims, loaded),
so it is not left to a clock or an estimate of idleness (on a loaded machine, quiet spells of a
quarter second came in the middle of the claim phases, and the collections with them):
`Collector.idle` runs one once the engine has done its idle work after an inventory change
(`Allocator.warm_engine`), when the frozen objects have grown to `FULL_AFTER_GROWTH` times what the
last one left; and `Collector.settle` runs one at once past `FULL_FORCED_GROWTH` times (claims that
never stop must not grow memory without bound; what full collections found in pipeline runs was
0-51 objects, what grew was the claims' own state, ~40 objects a claim held). An engine is cyclic
too (its inventory's callbacks point at its topology, which points back): a term's engine, dropped
when the term ends, is collected then (`Collector.collect`).
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_EVERY = 20_000
"""Allocations between young collections (CPython's default: 700)."""

FREEZE_AT = 15_000
"""New objects alive (the collector's young count) at which `Collector.settle` freezes them: below
`YOUNG_COLLECTION_EVERY`, so that while claims are decided young collections do not come."""

FULL_AFTER_GROWTH = 1.25
"""A full collection is due when the frozen objects have grown to this many times what the last
one left (or the load froze)."""

FULL_FORCED_GROWTH = 8.0
"""... and runs at once, after any engine work, past this many times."""


def freeze_long_lived() -> None:
    """Move what is alive now (a loaded engine) out of the cyclic collector's sight and make young
    collections rarer.

    No full collection first: it walks every object of the loaded fleet (2.6 s CPU of cold start
    at 100,000 GPUs, frontier mix), and the load, run with the collector off, leaves no cyclic
    garbage for it to find (0 objects at 3,000 frontier nodes). What little a term's start might
    leave is frozen with the engine, and found by the next full collection."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


class Collector:
    """The allocator process's collector policy (one per process: the collector is the process's).
    Call `loaded` once a term's engine is loaded, `settle` after each piece of engine work, `idle`
    once the engine's idle work is done, `collect` once a term has ended and its engine is dropped."""

    def __init__(self) -> None:
        self.baseline = 0
        """Frozen objects the last full collection (or the load) left."""
        self.frozen = 0
        """Frozen objects now, at least: counted at the load, a full collection or when one may be due,
        plus the young objects alive at each freeze since (an over-count: what was frozen and freed
        since is not taken off; the count itself walks the frozen objects' list, ~8 ms a million)."""

    def loaded(self) -> None:
        """Once a term's engine is loaded: `freeze_long_lived`, and a full collection is next due
        when the frozen objects have grown from these."""
        freeze_long_lived()
        self.baseline = self.frozen = gc.get_freeze_count()

    def settle(self) -> None:
        """After engine work: freeze what is alive if it has grown past `FREEZE_AT` since the last
        freeze (what a claim or a warm hop leaves is long-lived: the ledger's, the verdicts'), and
        collect past `FULL_FORCED_GROWTH`."""
        young = gc.get_count()[0]
        if young < FREEZE_AT:
            return
        gc.freeze()
        self.frozen += young
        if self._grown_to(FULL_FORCED_GROWTH):
            self.collect()

    def idle(self) -> None:
        """The engine's idle work is done (an inventory change is taken in): freeze, and collect if
        the frozen objects have grown to `FULL_AFTER_GROWTH` times what the last collection left."""
        self.frozen += gc.get_count()[0]
        gc.freeze()
        if self._grown_to(FULL_AFTER_GROWTH):
            self.collect()

    def _grown_to(self, factor: float) -> bool:
        """Whether the frozen objects are `factor` times the baseline or more (counted only when
        the over-count says so)."""
        if self.frozen < factor * self.baseline:
            return False
        self.frozen = gc.get_freeze_count()
        return self.frozen >= factor * self.baseline

    def collect(self) -> int:
        """A full collection over everything, frozen included (the number of unreachable objects
        found); what survives is frozen again. Also once a term has ended and its engine is dropped:
        paid between terms, not by the next term's rebuild (the next engine does not exist yet)."""
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self.baseline = self.frozen = gc.get_freeze_count()
        return found
