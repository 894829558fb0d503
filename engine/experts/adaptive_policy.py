"""The ``adaptive`` eviction policy: LFU with a short and a long memory and shadow pools that pick between them.

See engine/experts/policy.py for the policy contract and the other policies.
"""
from __future__ import annotations

import heapq
from typing import Iterable, Sequence

from engine.experts.admission import admit
from engine.experts.policy import DEFAULT_LFU_DECAY, LFUPolicy


class AdaptiveLFUPolicy:
    """LFU whose memory follows the routing: victims by a short or a long memory, whichever would
    have kept more of what was used.

    How long an LFU remembers is a bet on the routing. Where a sequence keeps reusing its recent
    experts (the random model's routing), a short memory (0.9 per step) follows it; where tokens
    route independently over skewed popularity (trained-like), a long one (0.99) estimates the
    popularity better. On the H200 (Qwen3-30B-A3B shape, 50% pool) 0.99 took trained-like batch 8
    from 3.51 to 3.14 ms per token at depth 2, but cut the random model's hit rate from 98.9% to
    95.1% at batch 8 (``benchmarks/results/lfu099_residency50_2026-11-29.json``).

    So both memories are kept (two :class:`LFUPolicy` over the same residents and uses), and each
    drives a shadow pool of as many keys as the real pool holds, admitting as the real pool does
    (:class:`_ShadowPool`). Each use is scored as a hit or a miss in both shadows; hits decay by
    ``window`` per step, and the memory whose shadow hit more (by ``margin``) picks the real pool's
    victims. A use costs two LFU updates and two set lookups; a shadow admission a heap operation.
    """

    name = "adaptive"
    scored = True

    def __init__(self, decays: Sequence[float] = (DEFAULT_LFU_DECAY, 0.99), window: float = 0.98,
                 margin: float = 0.003) -> None:
        self.memories = [LFUPolicy(d) for d in decays]
        self.decays = tuple(decays)
        self._shadows = [_ShadowPool(m) for m in self.memories]
        self.shadow_hits = [0.0] * len(decays)
        self.window, self.margin = window, margin
        self.active = 0                                   # index of the memory that picks victims
        # the pool's admissions per step when misses are read directly (admitted at the step's end);
        # None: each miss is copied in at once. The shadows admit the same way.
        self.admit_per_step: int | None = None
        self._unsettled = False
        self._pending: list[tuple[list[int], int]] = []   # uses the shadows have not scored yet

    @property
    def shadow_sizes(self) -> list[int]:
        """Keys each memory's shadow pool holds."""
        return [len(s.keys) for s in self._shadows]

    @property
    def decay(self) -> float:
        """The decay of the memory picking victims now."""
        return self.decays[self.active]

    @property
    def label(self) -> str:
        """``adaptive`` and the decay of the memory picking victims now, e.g. ``adaptive 0.99``."""
        return f"{self.name} {self.decay:g}"

    def insert(self, key: int) -> None:
        for m in self.memories:
            m.insert(key)

    def remove(self, key: int) -> None:
        for m in self.memories:
            m.remove(key)

    def touch(self, keys: Iterable[int]) -> None:
        """Both memories count the use now (victims need it); the shadow pools score it in
        :meth:`catch_up`, which the host calls while it waits for the GPU (at prefetch depth 0 the
        GPU waits for the host at every layer, so work done in ``touch`` adds to every step)."""
        keys = list(keys)
        if self._unsettled:
            self._settle()
        for m in self.memories:
            m.touch(keys)
        self._pending.append((keys, self.memories[0].size, False))

    def touch_chunk(self, uses: dict[int, int], tokens: int) -> None:
        """Both memories weigh a prompt chunk's uses (:meth:`LFUPolicy.touch_chunk`); the shadows score
        its keys as one use each and admit its misses as the real pool does, hottest first, each only
        over a colder key. The chunk's admissions come after this call: a shadow takes the pool's size
        when it scores the chunk."""
        if self._unsettled:
            self._settle()
        for m in self.memories:
            m.touch_chunk(uses, tokens)
        self._pending.append((list(uses), None, True))

    def catch_up(self) -> None:
        """Score the uses since the last call as hits or misses of both shadow pools."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        deferred = self.admit_per_step is not None
        size = self.memories[0].size
        for i, shadow in enumerate(self._shadows):
            hits = 0
            for keys, capacity, chunk in pending:
                hits += shadow.use(keys, size if capacity is None else capacity, deferred, chunk)
            self.shadow_hits[i] += hits

    def tick(self) -> None:
        """A step passed. The shadows' step-end admissions wait for the next use (:meth:`_settle`),
        which a replayed step makes while the GPU computes, not between two steps."""
        self.catch_up()
        for m in self.memories:
            m.tick()
        self._unsettled = True
        hits = self.shadow_hits = [h * self.window for h in self.shadow_hits]
        best = max(range(len(hits)), key=hits.__getitem__)
        if hits[best] > hits[self.active] * (1.0 + self.margin):
            self.active = best

    def _settle(self) -> None:
        """The last step's admissions into the shadow pools (misses read directly are admitted at
        the step's end; the decay since then scales every score alike, so the order is the same)."""
        self._unsettled = False
        if self.admit_per_step is not None:
            capacity = self.memories[0].size
            for shadow in self._shadows:
                shadow.end_step(capacity, self.admit_per_step)

    def admits(self, key: int) -> bool:
        return True

    def hotness(self, key: int) -> float:
        return self.memories[self.active].hotness(key)

    def victim(self, pinned: set[int]) -> int | None:
        return self.memories[self.active].victim(pinned)

    def victims(self, n: int, pinned: set[int]) -> list[int]:
        return self.memories[self.active].victims(n, pinned)

    def rank(self, keys: Iterable[int]) -> list[int]:
        return self.memories[self.active].rank(keys)


class _ShadowPool:
    """A simulated pool of up to ``capacity`` keys under one LFU memory's scores (see
    :class:`AdaptiveLFUPolicy`), admitting as the real pool does: a miss at once, over the coldest
    key (copied-in misses), or with an admission cap at the step's end, the hottest of its misses
    first, each only over a colder key (direct reads) — by the pool's own rule, engine/experts/admission.py.
    A lazy min-heap finds the coldest key as in :class:`LFUPolicy`."""

    def __init__(self, scores: LFUPolicy) -> None:
        self.scores = scores
        self.keys: set[int] = set()
        self._heap: list[tuple[float, int, int]] = []
        self._rescales = scores.rescales
        self._missed: dict[int, None] = {}             # this step's misses, when admitted at its end

    def use(self, keys: list[int], capacity: int, deferred: bool, chunk: bool = False) -> int:
        """One layer call's distinct ``keys`` (already touched); returns how many were in the pool. A
        prompt's ``chunk`` admits its misses at once, hottest first, each only over a colder key."""
        self._check_heap()
        held, hits = self.keys, 0
        if chunk:
            hot = self.scores.hotness
            hits = sum(1 for k in keys if k in held)
            for k in sorted((k for k in keys if k not in held), key=hot, reverse=True):
                admit([k], 1, max(capacity, 1) - len(held), self._coldest, hot, self._place)
            return hits
        for k in keys:
            if k in held:
                hits += 1
            elif deferred:
                self._missed[k] = None
            else:                                        # a miss at once, over the coldest key
                admit([k], 1, max(capacity, 1) - len(held), self._coldest, None, self._place)
        return hits

    def end_step(self, capacity: int, cap: int) -> None:
        """Admit at most ``cap`` of the step's misses, hottest first, each over a colder key."""
        if not self._missed:
            return
        self._check_heap()
        hot = self.scores.hotness
        admit(sorted(self._missed, key=hot, reverse=True), cap, max(capacity, 1) - len(self.keys), self._coldest,
              hot, self._place)
        self._missed = {}

    def _place(self, key: int, victim: int | None) -> None:
        if victim is not None:
            self.keys.discard(victim)
        self._add(key)

    def _add(self, key: int) -> None:
        self.keys.add(key)
        heapq.heappush(self._heap, self.scores.entry(key))

    def _coldest(self) -> int | None:
        heap = self._heap
        while heap:
            entry = heap[0]
            if entry[2] not in self.keys:
                heapq.heappop(heap)
                continue
            current = self.scores.entry(entry[2])
            if entry != current:
                heapq.heapreplace(heap, current)         # used since: it may not be the coldest
                continue
            return entry[2]
        return None

    def _check_heap(self) -> None:
        """Redo the heap after the scores were divided down, or when stale entries pile up."""
        if self._rescales != self.scores.rescales or len(self._heap) > 4 * len(self.keys) + 1024:
            self._heap = [self.scores.entry(k) for k in self.keys]
            heapq.heapify(self._heap)
            self._rescales = self.scores.rescales
