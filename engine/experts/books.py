"""``PrefetchLedger``: the one place that decides whether a prefetched expert was worth its copy.

Pure Python. A prefetch (host-issued, or a GPU-side claim) is a guess; it ends one of two ways: its
layer used it from its slot (a hit, which the prefetch gate credits to the look-ahead distance it was
guessed at), or it left the pool or its staging slot unused, or was still on the bus when its layer
ran (waste). Every path of the residency reports to this ledger instead of counting on its own.
Keys are store rows ``layer * E + expert``.
"""
from __future__ import annotations

from typing import Iterable

from engine.experts.counters import ResidencyCounters


class PrefetchLedger:
    def __init__(self, counters: ResidencyCounters) -> None:
        self.counters = counters
        self.unused: set[int] = set()           # prefetched, not used yet
        self.distance: dict[int, int] = {}      # prefetched key -> look-ahead distance it was guessed at

    def issued(self, key: int, distance: int) -> None:
        """A copy of ``key`` was issued for a layer ``distance`` layers past the predicting one."""
        self.unused.add(key)
        self.distance[key] = distance

    def take(self, key: int) -> int | None:
        """``key``'s layer came: the distance it was guessed at if it was an unused prefetch, else None
        (the caller says how it ended with :meth:`count`)."""
        if key not in self.unused:
            return None
        self.unused.discard(key)
        return self.distance.pop(key, 0)

    def count(self, hit: bool) -> None:
        """A prefetch ended: used from its slot (``hit``), or not."""
        if hit:
            self.counters.prefetch_hits += 1
        else:
            self.counters.prefetch_wasted += 1

    def waste(self, key: int) -> None:
        """``key`` lost its slot: waste if it was an unused prefetch."""
        if key in self.unused:
            self.unused.discard(key)
            self.counters.prefetch_wasted += 1

    def waste_all_but(self, keys: Iterable[int], kept: set[int]) -> None:
        """Of ``keys`` (a pool's residents before a resize), the unused prefetches not ``kept`` are waste;
        forget every unused prefetch outside ``kept``."""
        for k in keys:
            if k not in kept:
                self.waste(k)
        self.unused &= kept

    def end_step(self) -> None:
        """Forget the distances of prefetches no longer pending."""
        self.distance = {k: d for k, d in self.distance.items() if k in self.unused}


class MissForecast:
    """Which misses an earlier layer's prediction had named (``misses_predicted`` in the stats): what
    a perfect prefetch could have saved. Pure Python; keys are store rows."""

    def __init__(self, counters: ResidencyCounters, num_experts: int) -> None:
        self.counters, self.num_experts = counters, num_experts
        self.named: dict[int, set[int]] = {}      # layer -> keys this step's predictions named for it

    def note(self, layers: list[int], ids) -> None:
        """Remember the keys a prediction (``ids [P, T, k]`` on the host for ``layers``) named."""
        for layer, layer_ids in zip(layers, ids):
            base, flat = layer * self.num_experts, layer_ids.reshape(-1)
            if flat.numel() > self.num_experts:          # a prefill step: many tokens, few experts
                flat = flat.unique()
            self.named.setdefault(layer, set()).update(base + e for e in flat.tolist())

    def count(self, layer: int, misses: list[int]) -> None:
        """Count the misses of ``layer`` that an earlier layer's prediction had named."""
        named = self.named.pop(layer, None)
        if named:
            self.counters.misses_predicted += sum(1 for k in misses if k in named)

    def forget(self) -> None:
        self.named = {}
