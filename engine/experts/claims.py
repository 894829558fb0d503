"""``DeviceClaims``: the GPU-side prefetch of direct-read steps, as the residency books see it.

In a direct-read step the GPU itself can copy predicted experts in (engine/experts/device_prefetch.py:
a claim kernel takes a leased staging slot for a predicted expert that has none, copies it over the
bus on its own stream and writes its table entry). This part leases the slots, sets how many claims
a layer may make (:class:`engine.experts.prefetch.ClaimGate`), and at the step's end counts what the
claims became and offers the used ones to the pool like fills.
"""
from __future__ import annotations

import torch

from engine.experts.device_prefetch import DevicePrefetcher
from engine.experts.prefetch import ClaimGate
from engine.experts.residency import Residency
from engine.experts.step_books import StepBooks


class DeviceClaims:
    def __init__(self, r: Residency, prefetcher: DevicePrefetcher, gate: ClaimGate) -> None:
        self.r = r
        self.dp = prefetcher
        self.gate = gate           # how many of a layer's claims (by rank) are worth making

    def quota(self, tokens: int) -> int:
        """Claims per predicted layer in a step of ``tokens`` tokens: the leading ranks of a layer's
        claims that are mostly used (:class:`ClaimGate`), at most ``tuning.prefetch_per_layer``; one
        rank more on the prefetch gate's probe steps, so a closed rank (or a prefetch closed
        altogether) is measured again.

        Measured on the H200 (Qwen3-30B-A3B shape, bf16, 50% pool, depth 2, one claim per layer
        against none, same run): with trained-like routing the first claim of a layer is used 28% of
        the time at batch 1, and claiming is slower than not predicting at all (9.4-10.1 against
        8.3-8.9 ms per token): each wrong copy contends on the bus with the reads the step waits for.
        At batch 8 it is used 61-63% of the time and claiming is faster (4.04 against 4.3-4.4 ms).
        A second claim per layer is used 20% of the time at batch 8 and makes the step slower (4.5
        against 4.0 ms), so ``tuning.prefetch_per_layer`` stays 1. With near-uniform routing claims
        are used 10-16% of the time."""
        r = self.r
        gate = r.gate
        quota = self.gate.quota(tokens, r.tuning.prefetch_per_layer, probe=gate.steps % gate.probe_every == 0)
        if not admissions_landed(r):
            quota = 0          # an admission copied in from the host writes its table entry on the copy
            # stream, which the claims do not wait for: they could claim that key and race its entry
        return quota

    def open_for(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens claims by the gate's counts alone, not only because this
        is one of the gate's probe steps (which measure closed ranks again)."""
        return self.gate.quota(tokens, self.r.tuning.prefetch_per_layer, probe=False) > 0

    def begin(self, step: StepBooks, tokens: int) -> None:
        """Lease the free staging slots for this step's claims and set its per-layer quota."""
        r, dp, gate = self.r, self.dp, self.r.gate
        quota = self.quota(tokens)
        wanted = quota * (r.num_layers - 1)              # at most one claim batch per later layer
        books = r.books
        dp.begin([books.take_staging(-1) for _ in range(min(len(books.staging_free), dp.free.numel(), wanted))],
                 quota, self.gate.min_votes(tokens, probe=gate.steps % gate.probe_every == 0))
        step.dp_tokens = tokens

    def launch(self, moe_index: int, layers: list[int], ids: torch.Tensor) -> None:
        """After ``moe_index`` predicted ``layers`` (``ids [P, T, k]``): let the GPU copy the farthest
        layer's missing experts in (every predicted layer from the first MoE layer)."""
        r = self.r
        far = moe_index + r.prefetch_depth
        for j, t in enumerate(layers):
            if moe_index == 0 or t == far:
                self.dp.launch(t, ids[j], r.pool.table, r.store.rows, r.pool.buffer)

    def collect(self, step: StepBooks) -> list[int]:
        """Step end: count the claims (a hit: its layer found it in its slot), offer the used ones to
        the pool like fills; returns the keys whose table entries must be cleared."""
        r, dp = self.r, self.dp
        claims = dp.collect(step.dp_targets if step.dp_replay else dp.targets, step.dp_records)
        d = r.prefetch_depth
        ranked = []
        for key, slot, rank, votes in claims:
            hit = step.seen.get(key) == slot
            ranked.append((rank, hit, votes))
            r.ledger.count(hit)
            if hit:
                r.gate.on_use(d)
                step.filled.setdefault(key, slot)
                step.dp_used.add(key)
        r.gate.on_issue(d, len(claims))
        self.gate.record(step.dp_tokens, ranked)
        r.counters.device_copy_bytes += len(claims) * r.layout.nbytes
        step.dp_active = False
        return [claim[0] for claim in claims]

    def undo(self, step: StepBooks) -> None:
        """A step cut short: wait for its claims and clear their table entries."""
        self.dp.join()
        keys = self.collect(step)
        self.r.pool.write_table(keys, [-1] * len(keys), None)
        step.dp_used = set()


def admissions_landed(r: Residency) -> bool:
    """True when none of the copies in flight is an admission (only prefetches into staging)."""
    return all(s >= r.pool.slots for s in r.pool.copies.busy_slots())
