"""Eviction policies of the device expert pool.

A key is an expert's store row, ``layer * E + expert``. The pool tells its policy which keys are
resident (``insert`` / ``remove``) and which were used (``touch``); when it needs a slot it asks
for a ``victim`` outside the pinned set (the current layer's experts and those being prefetched),
and on a resize it keeps the best-``rank``ed residents.

* ``lru``: least recently used goes first.
* ``lfu``: least "hot" goes first, where hotness is a use count that decays by
  ``decay`` per engine step, so yesterday's favourites fade. Ties go to the least recently used.
* ``adaptive`` (default): LFU with a short (0.9) and a long (0.99) memory kept side by side; the
  one whose simulated pool would have hit more over the last ~50 steps picks the victims (see
  :class:`engine.experts.adaptive_policy.AdaptiveLFUPolicy`). On the H200 it was faster than ``lfu`` at depth 2 in every cell of
  ``benchmarks/results/residency50_steady_2026-11-30a.json``.
* ``static``: a fixed placement, the most-routed experts of a recorded routing profile; nothing
  placed is ever evicted, and experts outside the placement are only ever staged.

``make_policy`` (engine/experts/policies.py) builds one by name.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Iterable, Protocol, Sequence

from engine.errors import ConfigError

POLICIES = ("lfu", "lru", "adaptive", "static")
DEFAULT_LFU_DECAY = 0.9   # per step: a use 7 steps old weighs half a fresh one (see LFUPolicy)


class EvictionPolicy(Protocol):
    name: str
    # the pool's admissions per step when misses are read directly (None: each miss is copied in at
    # once); only the adaptive policy's shadow pools use it, to admit as the pool does
    admit_per_step: int | None
    # keys have scores (``hotness``): an admission then needs a victim colder than the newcomer
    scored: bool

    @property
    def label(self) -> str:
        """The policy as the stats show it (the adaptive one adds the decay it picks victims by)."""

    def insert(self, key: int) -> None:
        """``key`` took a pool slot."""

    def remove(self, key: int) -> None:
        """``key`` left the pool."""

    def touch(self, keys: Iterable[int]) -> None:
        """These keys were used by one layer call."""

    def touch_chunk(self, uses: dict[int, int], tokens: int) -> None:
        """One layer call of a prompt's chunk of ``tokens`` tokens used each key of ``uses`` for that many
        of them: evidence of how often each is used per token, counted before the call's misses are
        admitted (so an admission can compare the newcomer with its victim)."""

    def tick(self) -> None:
        """One engine step passed."""

    def catch_up(self) -> None:
        """Do the bookkeeping ``touch`` deferred (the host calls this while it waits for the GPU)."""

    def admits(self, key: int) -> bool:
        """Whether ``key`` may take a pool slot at all (otherwise it is staged)."""

    def hotness(self, key: int) -> float:
        """``key``'s score as of now, which admissions compare where ``scored`` (unscored policies: 0)."""

    def victim(self, pinned: set[int]) -> int | None:
        """The resident key to evict next, never one in ``pinned``; None if every resident is pinned."""

    def victims(self, n: int, pinned: set[int]) -> list[int]:
        """Up to ``n`` resident keys outside ``pinned``, the one to evict first first (what ``n``
        calls of ``victim`` would give, evicting each)."""

    def rank(self, keys: Iterable[int]) -> list[int]:
        """``keys`` ordered most valuable first (what a shrink keeps)."""


class LRUPolicy:
    """Least recently used."""

    name = "lru"
    scored = False
    admit_per_step: int | None = None    # only the adaptive policy's shadow pools admit per step

    @property
    def label(self) -> str:
        return self.name

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()   # oldest first

    def insert(self, key: int) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def remove(self, key: int) -> None:
        self._order.pop(key, None)

    def touch(self, keys: Iterable[int]) -> None:
        for k in keys:
            if k in self._order:
                self._order.move_to_end(k)

    def touch_chunk(self, uses: dict[int, int], tokens: int) -> None:
        # the chunk's residents in the order of their uses, the most used the most recent (its misses are
        # inserted after, as the newest)
        self.touch(sorted(uses, key=uses.__getitem__))

    def hotness(self, key: int) -> float:
        return 0.0

    def tick(self) -> None:
        pass

    def catch_up(self) -> None:
        pass

    def admits(self, key: int) -> bool:
        return True

    def victim(self, pinned: set[int]) -> int | None:
        found = self.victims(1, pinned)
        return found[0] if found else None

    def victims(self, n: int, pinned: set[int]) -> list[int]:
        found: list[int] = []
        for k in self._order:
            if len(found) >= n:
                break
            if k not in pinned:
                found.append(k)
        return found

    def rank(self, keys: Iterable[int]) -> list[int]:
        pos = {k: i for i, k in enumerate(self._order)}
        return sorted(keys, key=lambda k: -pos.get(k, -1))


class LFUPolicy:
    """Use counts with exponential decay per step; a lazy min-heap finds the coldest resident.

    Instead of decaying every score each step, each new use adds ``(1/decay) ** step``: the order
    is the same and a step costs nothing. Scores are rescaled before they grow past floats.

    A use only updates the key's ``(score, last use)``; it does not touch the heap. Both only grow,
    so a heap entry is never above its key's current value: ``victim`` pops the smallest entry and,
    if it is out of date, pushes the current one back and pops again. The coldest up-to-date entry
    is then the coldest resident, and a use (once per expert per layer on the decode path) costs
    two dict writes.

    The decay trades memory for tracking. With trained-like routing (popularity skewed, tokens
    otherwise independent) a longer memory estimates popularity better: on the CPU at 12 layers x
    64 experts, top-8, half the experts pooled, depth 2, going from 0.9 to 0.99 cut the misses by
    23% at batch 1 and 5% at batch 8 (``benchmarks/lfu_decay.py``,
    ``benchmarks/results/lfu_decay_2026-11-29.json``). On the H200 at the Qwen3-30B-A3B shape
    (``benchmarks/results/lfu099_residency50_2026-11-29.json``) 0.99 helped only trained-like batch 8
    (3.51 -> 3.14 ms per token at depth 2); with the random model's routing, which reuses recent
    experts, the hit rate fell (99.5% -> 97.5% at batch 1, 98.9% -> 95.1% at batch 8) and steps got
    slower (depth 2 4.90 -> 6.70 and 1.79 -> 3.64 ms per token). So the default stays 0.9. (Trained-like
    batch 1 was slower in that run too, but so was uniform depth 0 at an unchanged hit rate, 9.95
    against 6.79-7.73 ms per token in the other runs: that run's host was slow, so those timings
    say nothing about the decay.)
    """

    name = "lfu"
    scored = True
    admit_per_step: int | None = None    # only the adaptive policy's shadow pools admit per step

    @property
    def label(self) -> str:
        return self.name
    _RESCALE_AT = 1e150

    def __init__(self, decay: float = DEFAULT_LFU_DECAY) -> None:
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"LFU decay must be in (0, 1] (got {decay}); the default is {DEFAULT_LFU_DECAY}")
        self._growth = 1.0 / decay
        self._weight = 1.0                       # value of one use now
        self._score: dict[int, float] = {}       # every key ever used, resident or not
        self._seq: dict[int, int] = {}           # last-touch order, for ties
        self._resident: set[int] = set()
        self._heap: list[tuple[float, int, int]] = []   # (score, seq, key), stale entries skipped
        self._clock = itertools.count()
        self.rescales = 0                        # times the scores were divided down (heap entries redone)

    def insert(self, key: int) -> None:
        self._resident.add(key)
        self._seq.setdefault(key, next(self._clock))
        self._push(key)

    def remove(self, key: int) -> None:
        self._resident.discard(key)

    def touch(self, keys: Iterable[int]) -> None:
        score, seq, weight = self._score, self._seq, self._weight
        for k in keys:
            score[k] = score.get(k, 0.0) + weight
            seq[k] = next(self._clock)

    def touch_chunk(self, uses: dict[int, int], tokens: int) -> None:
        """Each key gains its share of the chunk's tokens times the memory's horizon (``1 / (1 - decay)``
        steps), or times the tokens where the chunk is shorter: a prompt weighs at most as much as the
        steps the memory remembers, so after it the scores are what a steady run of such tokens
        would leave, and a key used by every token of the prompt ranks above one that a few used."""
        horizon = float("inf") if self._growth == 1.0 else 1.0 / (1.0 - 1.0 / self._growth)
        scale = self._weight * min(1.0, horizon / max(tokens, 1))
        score, seq = self._score, self._seq
        for k in sorted(uses, key=uses.__getitem__):          # ties: the most used is the most recent
            score[k] = score.get(k, 0.0) + uses[k] * scale
            seq[k] = next(self._clock)

    def tick(self) -> None:
        self._weight *= self._growth
        if self._weight > self._RESCALE_AT:
            for k in self._score:
                self._score[k] /= self._weight
            self._weight = 1.0
            self.rescales += 1
            self._heap = []
            for k in self._resident:
                self._push(k)

    def catch_up(self) -> None:
        pass

    def admits(self, key: int) -> bool:
        return True

    def hotness(self, key: int) -> float:
        """Decayed use count of ``key`` as of the current step."""
        return self._score.get(key, 0.0) / self._weight

    def victim(self, pinned: set[int]) -> int | None:
        found = self.victims(1, pinned)
        return found[0] if found else None

    def victims(self, n: int, pinned: set[int]) -> list[int]:
        """The ``n`` coldest residents outside ``pinned`` in one pass over the heap (a step end
        admits dozens of experts: one pass each would re-pop the same pinned and stale entries)."""
        if len(self._heap) > 4 * len(self._resident) + 1024:   # drop entries of evicted keys
            self._heap = [(self._score.get(k, 0.0), self._seq[k], k) for k in self._resident]
            heapq.heapify(self._heap)
        heap, score, seq = self._heap, self._score, self._seq
        kept: list[tuple[float, int, int]] = []
        found: list[int] = []
        while heap and len(found) < n:
            entry = heapq.heappop(heap)
            key = entry[2]
            if key not in self._resident:
                continue                                 # evicted since
            current = (score.get(key, 0.0), seq[key], key)
            if entry != current:
                heapq.heappush(heap, current)            # used since: it may not be the coldest
                continue
            kept.append(entry)
            if key not in pinned and key not in found:     # a key re-inserted has two equal entries
                found.append(key)
        for entry in kept:
            heapq.heappush(heap, entry)
        return found

    def rank(self, keys: Iterable[int]) -> list[int]:
        return sorted(keys, key=lambda k: (-self._score.get(k, 0.0), -self._seq.get(k, -1)))

    @property
    def size(self) -> int:
        """Resident keys."""
        return len(self._resident)

    @property
    def resident(self) -> frozenset[int]:
        """The keys it holds as resident."""
        return frozenset(self._resident)

    def entry(self, key: int) -> tuple[float, int, int]:
        """``key``'s heap entry as of now: (score, last use, key); the smallest is the coldest."""
        return self._score.get(key, 0.0), self._seq.get(key, -1), key

    def _push(self, key: int) -> None:
        heapq.heappush(self._heap, self.entry(key))


class StaticPolicy:
    """A fixed placement from a routing profile: the most-routed (layer, expert) pairs overall."""

    name = "static"
    scored = False
    admit_per_step: int | None = None    # only the adaptive policy's shadow pools admit per step

    @property
    def label(self) -> str:
        return self.name

    def __init__(self, counts: Sequence[Sequence[int]]) -> None:
        num_experts = len(counts[0]) if counts else 0
        flat = [(c, l * num_experts + e) for l, row in enumerate(counts) for e, c in enumerate(row)]
        # most routed first; ties by key so the placement is reproducible
        self._order = [k for _, k in sorted(flat, key=lambda ck: (-ck[0], ck[1]))]
        self._placed: set[int] = set()
        self._capacity = 0

    def place(self, slots: int) -> list[int]:
        """Fix the placement for a pool of ``slots`` slots; returns the placed keys, best first."""
        self._capacity = slots
        placed = self._order[:slots]
        self._placed = set(placed)
        return placed

    def insert(self, key: int) -> None:
        pass

    def remove(self, key: int) -> None:
        pass

    def touch(self, keys: Iterable[int]) -> None:
        pass

    def touch_chunk(self, uses: dict[int, int], tokens: int) -> None:
        pass

    def tick(self) -> None:
        pass

    def catch_up(self) -> None:
        pass

    def admits(self, key: int) -> bool:
        return key in self._placed

    def hotness(self, key: int) -> float:
        return 0.0

    def victim(self, pinned: set[int]) -> int | None:
        return None

    def victims(self, n: int, pinned: set[int]) -> list[int]:
        return []

    def rank(self, keys: Iterable[int]) -> list[int]:
        pos = {k: i for i, k in enumerate(self._order)}
        return sorted(keys, key=lambda k: pos[k])
