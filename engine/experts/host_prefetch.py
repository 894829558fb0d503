"""Host-side prefetching of :class:`engine.experts.manager.OffloadedExperts`: copies of predicted
experts into staging slots, issued while a layer computes, and the bookkeeping of which misses a
prediction had named (see the manager's module doc)."""
from __future__ import annotations

import torch


class HostPrefetch:
    """Prefetch half of :class:`engine.experts.manager.OffloadedExperts` (a mixin over its state)."""

    def issue_prefetch(self) -> None:
        """Issue the prefetch copies an ``acquire(..., defer_prefetch=True)`` left pending."""
        pending, self._pending_prefetch = self._pending_prefetch, None
        if pending is not None:
            self._prefetch(*pending)

    def _drop_staging(self, slot: int) -> None:
        key = self.pool.release_staging(slot)
        self._prefetched.pop(key, None)
        self.prefetches.waste(key)

    def _reclaim_staging(self, layer: int) -> int:
        """Take back the staging slot prefetched for the farthest later layer (a miss outranks a guess)."""
        later = [(j, s) for s, j in self.pool.lease.items() if j > layer]
        if not later:
            raise RuntimeError(f"no staging slot left for layer {layer}: {len(self.pool.lease)} leased of "
                               f"{self.pool.staging}; staging must hold one layer's experts")
        _, slot = max(later)
        self._drop_staging(slot)
        return self.pool.take_staging(layer)

    def _prefetch(self, layers: list[int], ids: torch.Tensor) -> None:
        """Issue copies of the predicted experts (``ids [P, T, k]`` on the host), nearest layer first."""
        pinned = self._current | self._prefetched.keys()
        origin = layers[0] - 1                     # the layer whose input made the prediction
        slot_of = self.pool.slot_of
        for layer, layer_ids in zip(layers, ids):
            base, pairs = layer * self.num_experts, []
            cap = self.gate.quota(layer - origin)
            for e in dict.fromkeys(layer_ids.t().reshape(-1).tolist()):   # every token's first choice first
                key = base + e
                if slot_of[key] < 0:
                    if cap is not None and len(pairs) >= cap:
                        continue
                    slot = self._slot_for(key, layer, pinned, demand=False)
                    if slot is None:
                        break                      # no room left: later guesses would not fit either
                    pairs.append((slot, key))
                    self.prefetches.issued(key, layer - origin)
                self._prefetched.setdefault(key, layer)
                pinned.add(key)
            self.pool.load(pairs, demand=False)
            self.gate.on_issue(layer - origin, len(pairs))

    def _note_predicted(self, layers: list[int], ids: torch.Tensor) -> None:
        """Remember the keys a prediction (``ids [P, T, k]`` on the host for ``layers``) named."""
        for layer, layer_ids in zip(layers, ids):
            base, flat = layer * self.num_experts, layer_ids.reshape(-1)
            if flat.numel() > self.num_experts:          # a prefill step: many tokens, few experts
                flat = flat.unique()
            self._named.setdefault(layer, set()).update(base + e for e in flat.tolist())

    def _count_predicted(self, layer: int, misses: list[int]) -> None:
        """Count the misses of ``layer`` that an earlier layer's prediction had named."""
        named = self._named.pop(layer, None)
        if named:
            self.counters.misses_predicted += sum(1 for k in misses if k in named)
