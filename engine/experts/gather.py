"""``GatherSlots``: in a direct-read step, a missing expert crosses the bus once, by a copy.

The MoE decode kernels can read a missing expert from host memory themselves, once per token that
uses it. Instead, each layer's missing experts (not the host CPU's) that at least
``ResidencyTuning.gather_min_uses`` of its real tokens use are copied once over the bus, right after
the layer's publish and before its MoE kernels, into the expert's fill slot (so the step may still
admit it) or else into one of the step's gather slots; the layer's snapshot then names that slot, and
the kernels read the expert from device memory (kernels/publish_ids.py: ``publish_direct(gather=...)``
and ``gather_copy``). Gather slots are staging slots leased for the whole step and reused layer after
layer: a layer's copy runs after the previous layer's kernels on the same stream.

With ``ResidencyTuning.gather_min_uses`` 1 (the default; ``ExpertManager.set_gather(True, 1)``), every
missing expert is gathered, in steps of one token too: the layer's MoE kernels then read only device memory,
and the copy kernel, not their own loads, carries the bus (where the kernels' reads of host memory
are slow: about 20 GB/s on the H100 host against 55 GB/s for copies).

The host follows: a missing expert that ``min_uses`` or more real tokens use and whose published
fill column names a slot was gathered; it counts once in the bytes read from host memory, and only
an expert in a fill slot (not a gather slot) is a candidate for admission.

At batch 8 with no pool, the direct reads of the Qwen3-30B-A3B shape moved 904 MB per token where
copying each missing expert once moved 738 (bf16). Measured on the H200 at depth 2, batch 8, no pool
(benchmarks/results/gather_ab_2026-12-05.json): int4 344 tok/s gathered against 251 not, bf16 129
against 128. Every missing expert gathered against only the shared ones, on the H100 host at no
pool (int4, gather_ab_2026-12-05b.json): batch 1 164 against 144 tok/s at depth 0 with cold experts
auto, 101 against 87 over the bus alone.
"""
from __future__ import annotations

from collections import Counter

import torch

from engine.experts.residency import Residency
from engine.experts.step_books import StepBooks
from engine.host_copy import StagedInts, host_to
from kernels.publish_ids import SLOT_CPU, GatherArgs, gather_copy, gather_copy_ref


class GatherSlots:
    def __init__(self, r: Residency) -> None:
        self.r = r
        E, dev = r.num_experts, r.device
        self._staged = StagedInts(1 + E, dev)
        self.info = self._staged.tensor                                         # [count, slots...]
        self.work = torch.zeros(1 + 2 * E, dtype=torch.int64, device=dev)      # [n, (slot, row) ...]
        self._sent = 0                  # the gather slot count the device holds
        # the tuning is read once: a recorded step's kernels gather or not, and the host's books must
        # agree with every recording; ExpertManager.set_gather changes it between steps, and the
        # recordings are then made again
        self.possible = r.layout.nbytes % 4 == 0          # the copy kernel moves whole int32 words
        self.enabled = r.tuning.gather_shared and self.possible
        self.min_uses = r.tuning.gather_min_uses          # tokens that must use an expert to gather it

    def on(self, tokens: int) -> bool:
        """Whether a direct-read step of ``tokens`` tokens gathers missing experts (those at least
        ``min_uses`` of its tokens use)."""
        return self.enabled and tokens >= self.min_uses

    def begin(self, step: StepBooks, tokens: int, k: int) -> None:
        """Lease ``step``'s gather slots (at most one per ``min_uses`` of its ``tokens * k`` pairs, and no more
        than the free staging) and upload them."""
        books = self.r.books
        want = min(tokens * k // self.min_uses, self.r.num_experts, len(books.staging_free)) if self.on(tokens) else 0
        step.gather_slots = [books.take_staging(-1) for _ in range(want)]
        if want == 0 and self._sent == 0:    # the device already holds "no gather slots" (steps of one token)
            return
        self._sent = want
        self._staged.send([want] + step.gather_slots)

    def release(self, step: StepBooks) -> None:
        """Give back ``step``'s gather slots once its kernels are launched for good (its deferred end):
        a later step's use of them is ordered after those kernels on the compute stream."""
        books = self.r.books
        for slot in step.gather_slots or ():
            if books.lease.get(slot) == -1 and books.owner[slot] < 0:
                books.release_staging(slot)
        step.gather_slots = []

    def args(self, moe_index: int) -> GatherArgs:
        return GatherArgs(self.info, self.work, moe_index * self.r.num_experts, self.min_uses)

    def copy(self, moe_index: int) -> None:
        """Device work (recorded with the step): the layer's gathered experts, host -> their slots."""
        r = self.r
        run = gather_copy if r.device.type == "cuda" else gather_copy_ref
        run(self.work, r.store.rows, r.pool.buffer)

    # ---- the host's side -------------------------------------------------------------------------
    def gathered(self, ids: list[int], seen: list[int], fills: list[int]) -> dict[int, int]:
        """Expert -> slot of each expert a layer gathered, from what it published for its real rows:
        missing (not the host CPU's), used by ``min_uses`` or more of them, and a slot in the fill column."""
        uses = Counter(ids)
        return {e: f for e, s, f in zip(ids, seen, fills)
                if s < 0 and s != SLOT_CPU and uses[e] >= self.min_uses and f >= 0}

    def eager(self, step: StepBooks, moe_index: int, snap: torch.Tensor, ids: list[int], seen: list[int],
              fills: list[int]) -> dict[int, int]:
        """What the publish kernel and the gather copy do for a recorded step, for an eager one:
        ``seen`` as the kernels would read it (the host CPU's experts not missing), ``fills`` the fill
        slot of each id. Copies each gathered expert in, points ``snap`` at it; returns expert -> slot."""
        r = self.r
        uses = Counter(ids)
        spare = iter(step.gather_slots or ())
        out: dict[int, int] = {}
        for e, s, f in zip(ids, seen, fills):
            if s >= 0 or uses[e] < self.min_uses or e in out:
                continue
            slot = f if f >= 0 else next(spare, -1)
            if slot >= 0:
                out[e] = slot
        if out:
            base = moe_index * r.num_experts
            pairs = sorted(out.items())
            for e, s in pairs:           # on the compute stream, from the page-locked store: before the kernels
                r.pool.buffer[s].copy_(r.store.rows[base + e], non_blocking=True)
            snap[[e for e, _ in pairs]] = host_to([s for _, s in pairs], torch.int32, r.device)
        return out
