"""``FillSlots``: admission without a second trip over the bus, for direct-read steps.

Each direct-read step leases up to ``capacity()`` free staging slots as fill slots; each layer's
snapshot gives each of its missing experts, in order of first occurrence, the next of them (the
publish kernel in a recorded step, :meth:`eager` otherwise), and the MoE kernels that read such an
expert from host memory also write it into that slot. At the step's end the hottest filled experts
are admitted into the pool by a device-to-device copy (:meth:`promote`).

The step's fill slots reach the GPU as ``[next, count, slots...]`` in one upload from page-locked
staging, reused once the last upload has run (a step later: steps start after the last one's tokens).
A replayed step's slots may be leased and uploaded early (:meth:`arm`), while the GPU finishes the
step before; whatever comes first other than that replay gives them back (:meth:`disarm`).
"""
from __future__ import annotations

import torch

from engine.experts.policy import StaticPolicy
from engine.experts.residency import Residency
from engine.experts.step_books import StepBooks
from engine.host_copy import StagedInts, host_to


class FillSlots:
    def __init__(self, r: Residency) -> None:
        self.r = r
        L, E, dev = r.num_layers, r.num_experts, r.device
        self.rows = torch.full((L, E), -1, dtype=torch.int32, device=dev)   # layer -> expert -> fill slot
        self._staged = StagedInts(2 + E, dev)
        self.info = self._staged.tensor
        self.meta, self.free = self.info[:2], self.info[2:]
        self.armed: list[int] | None = None       # leased and uploaded for the next replayed step
        self.admit_per_step = max(1, E // 2)

    def capacity(self) -> int:
        """Fill slots a direct-read step can lease now (0: misses are admitted by copying them in)."""
        if isinstance(self.r.policy, StaticPolicy) or self.r.pool.slots == 0:
            return 0
        free, share = len(self.r.books.staging_free), self.r.tuning.fill_share
        leased = min(free, max(1, round(free * share))) if share > 0 and free else 0   # a share, never 0 of many
        return min(self.admit_per_step, leased, self.r.num_experts)

    def begin(self, step: StepBooks) -> None:
        """Lease ``step``'s fill slots (free staging slots no table entry points at), or take those
        armed for it, already on the device."""
        step.fill_used, step.filled = 0, {}
        if self.armed is not None:
            step.fill_slots, self.armed = self.armed, None
            return
        books = self.r.books
        step.fill_slots = [books.take_staging(-1) for _ in range(self.capacity())]
        self._staged.send([0, len(step.fill_slots)] + step.fill_slots)

    def arm(self) -> None:
        """Lease and upload the next replayed step's fill slots now."""
        step = StepBooks()
        self.begin(step)
        self.armed = step.fill_slots

    def disarm(self) -> None:
        """Give back fill slots leased for a next step that did not come (nothing was written to them)."""
        armed, self.armed = self.armed, None
        books = self.r.books
        for slot in armed or ():
            if books.lease.get(slot) == -1 and books.owner[slot] < 0:
                books.release_staging(slot)

    def eager(self, step: StepBooks, moe_index: int, ids: list[int], seen: list[int]) -> list[int]:
        """What the publish kernel does for a recorded step: the fill slot of each id (its first
        missing occurrence takes the next free one); the layer's fill row written for the kernels."""
        row = [-1] * self.r.num_experts
        for e, s in zip(ids, seen):
            if s < 0 and row[e] < 0 and step.fill_used < len(step.fill_slots):
                row[e] = step.fill_slots[step.fill_used]
                step.fill_used += 1
        self.rows[moe_index].copy_(host_to(row, torch.int32, self.r.device))
        return [row[e] for e in ids]

    def promote(self, step: StepBooks, admitted: list[tuple[int, int]]) -> None:
        """Copy each admitted ``(slot, key)`` from its fill slot into its pool slot on the compute
        stream, after the step's kernels wrote it (device to device: nothing crosses the bus)."""
        self.r.pool.copy_slots([(slot, step.filled[key]) for slot, key in admitted])
        self.r.counters.fills += sum(1 for _, key in admitted if key not in step.dp_used)

    def uploaded(self) -> tuple[list[int], list[int]]:
        """The fill slots as uploaded for the GPU: ``[next, count]`` and the slots (a device read)."""
        return self.meta.tolist(), self.free.tolist()
