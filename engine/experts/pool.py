"""Device expert pool: ``uint8 [S + R, nbytes]`` slots and the ``[L, E]`` slot table.

Slots ``0..S-1`` are the pool proper, owned by the eviction policy. Slots ``S..S+R-1`` are
staging slots: an expert that gets no pool slot (a pool of 0 slots, or every pool slot pinned, or
a static placement that excludes it) is copied into one, leased to the layer that needs it, and
released once that layer is past. ``R = 2 E`` (two layers' worth: the current layer's misses plus
prefetches for the next ones), and 0 when the pool holds every expert.

The slot table maps (layer, expert) -> slot or -1. The host mirror (``slot_of``, indexed by key
``layer * E + expert``) is what the policy and the manager read; row ``l`` of the device table is
pushed when layer ``l`` acquires its experts, which is the only time a kernel reads it.

Resizing frees the old buffer before allocating the new one and then copies the kept experts
back from the host store: the transient peak is max(old, new) rather than old + new, so a grow
never needs more than its own size of free memory. A failed allocation re-creates the old pool.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from engine.config import format_size
from engine.errors import ReconfigureError
from engine.experts.prefetch import CopyEngine
from engine.experts.store import HostExpertStore
from engine.host_copy import host_to


class ExpertPool:
    """Slots on the compute device, their owners, and the slot table."""

    def __init__(self, store: HostExpertStore, device: torch.device, slots: int,
                 keep: Iterable[int] = (), budget_bytes: int | None = None) -> None:
        self.store = store
        self.device = device
        self.num_layers, self.num_experts = store.num_layers, store.num_experts
        self.num_keys = self.num_layers * self.num_experts
        self.nbytes = store.layout.nbytes
        self.budget_bytes = budget_bytes
        self.copies = CopyEngine(device)
        self.table = torch.full((self.num_layers, self.num_experts), -1, dtype=torch.int32, device=device)
        self.slot_of = [-1] * self.num_keys          # host mirror of the table, by key
        self.slots, self.staging = 0, 0
        self.buffer: torch.Tensor | None = None
        self.views: dict[str, torch.Tensor] | None = None
        self.owner: list[int] = []                    # slot -> key or -1
        self.free: list[int] = []                     # free pool slots, lowest last (popped first)
        self.staging_free: list[int] = []
        self.lease: dict[int, int] = {}               # staging slot -> layer it was taken for
        self._stale: set[int] = set()                 # layers whose device row differs from the mirror
        self.resize(slots, keep)

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def full(self) -> bool:
        """Every expert of every layer has a pool slot (static table, no misses possible)."""
        return self.slots >= self.num_keys

    @property
    def bytes(self) -> int:
        """Device bytes of the whole buffer, staging included."""
        return 0 if self.buffer is None else self.buffer.numel()

    def slots_used(self) -> int:
        """Pool slots holding an expert."""
        return self.slots - len(self.free)

    def resident_keys(self) -> list[int]:
        """Keys holding a pool slot (staging excluded)."""
        return [k for k in self.owner[:self.slots] if k >= 0]

    def staging_for(self, slots: int) -> int:
        """Staging slots that go with a pool of ``slots`` slots."""
        return 0 if slots >= self.num_keys else 2 * self.num_experts

    # ---- slot bookkeeping --------------------------------------------------------------------
    def assign(self, key: int, slot: int) -> None:
        self.slot_of[key] = slot
        self.owner[slot] = key
        self._stale.add(key // self.num_experts)

    def unassign(self, slot: int) -> int:
        """Empty ``slot``; returns the key it held."""
        key = self.owner[slot]
        self.owner[slot] = -1
        if key >= 0:
            self.slot_of[key] = -1
            self._stale.add(key // self.num_experts)
        return key

    def take_free(self) -> int | None:
        return self.free.pop() if self.free else None

    def take_staging(self, layer: int) -> int | None:
        if not self.staging_free:
            return None
        slot = self.staging_free.pop()
        self.lease[slot] = layer
        return slot

    def release_staging(self, slot: int) -> int:
        """Return a staging slot to the free list; returns the key it held."""
        del self.lease[slot]
        self.staging_free.append(slot)
        return self.unassign(slot)

    def load(self, pairs: Sequence[tuple[int, int]], demand: bool) -> None:
        """Copy experts into slots: ``(slot, key)`` pairs (keys are store rows)."""
        self.copies.copy(pairs, self.buffer, self.store.rows, demand)

    def copy_slots(self, pairs: Sequence[tuple[int, int]]) -> None:
        """``buffer[dst] <- buffer[src]`` for each ``(dst, src)`` on the current stream, in one batched
        copy (a step end promotes dozens of fill slots: one launch each would keep the GPU waiting
        on the host). Slots are copied as the widest words their size allows."""
        if not pairs:
            return
        words = next(w for w in (torch.int64, torch.int32, torch.uint8) if self.nbytes % w.itemsize == 0)
        rows = self.buffer.view(words)
        torch._foreach_copy_([rows[d] for d, _ in pairs], [rows[s] for _, s in pairs])

    def push_row(self, layer: int) -> torch.Tensor:
        """Send the host mirror of ``layer``'s row to the device table if it changed since it was last
        sent; returns ``table[layer]`` [E]."""
        if layer in self._stale:
            self._stale.discard(layer)
            lo = layer * self.num_experts
            self.table[layer].copy_(host_to(self.slot_of[lo:lo + self.num_experts], torch.int32, self.device))
        return self.table[layer]


    # ---- resize ------------------------------------------------------------------------------
    def resize(self, slots: int, keep: Iterable[int]) -> None:
        """Re-create the pool with ``slots`` slots holding the first ``slots`` of ``keep``.

        A pool holding every expert places key k in slot k (a static table). Raises
        ReconfigureError, leaving the pool as it was, when the size is over the budget or the
        allocation fails. Must be called between steps (no staging lease outstanding).
        """
        slots = max(0, min(int(slots), self.num_keys))
        total = slots + self.staging_for(slots)
        if self.budget_bytes is not None and total * self.nbytes > self.budget_bytes:
            raise ReconfigureError(
                f"an expert pool of {slots} slots plus {total - slots} staging slots needs "
                f"{format_size(total * self.nbytes)} but the GPU memory budget leaves "
                f"{format_size(self.budget_bytes)} for it; lower expert_pool_size or raise gpu_memory_budget")
        old_owner, old_slots = list(self.owner), self.slots
        self.copies.synchronize()                          # nothing may still write the old buffer
        self.buffer = self.views = None                      # drop the old buffer before allocating
        try:
            buffer = _allocate(total, self.nbytes, self.device)
        except ReconfigureError:
            self._rebuild(_allocate(len(old_owner), self.nbytes, self.device), old_slots,
                          [(s, k) for s, k in enumerate(old_owner[:old_slots]) if k >= 0])
            raise
        kept = list(range(self.num_keys)) if slots >= self.num_keys else list(keep)[:slots]
        self._rebuild(buffer, slots, list(enumerate(kept)))

    def _rebuild(self, buffer: torch.Tensor, slots: int, placed: list[tuple[int, int]]) -> None:
        self.buffer, self.slots, self.staging = buffer, slots, buffer.shape[0] - slots
        self.views = self.store.layout.views(buffer)        # typed per-slot views, rebuilt with the buffer
        self.owner = [-1] * buffer.shape[0]
        self.slot_of = [-1] * self.num_keys
        for slot, key in placed:
            self.assign(key, slot)
        used = {s for s, _ in placed}
        self.free = [s for s in range(slots - 1, -1, -1) if s not in used]
        self.staging_free = list(range(buffer.shape[0] - 1, slots - 1, -1))
        self.lease = {}
        self.load(placed, demand=False)
        self.copies.join()
        self.table.copy_(torch.tensor(self.slot_of, dtype=torch.int32).view(self.num_layers, self.num_experts))
        self._stale.clear()

    def close(self) -> None:
        """Free the device buffer once every copy into it is done."""
        self.copies.synchronize()
        self.buffer = self.views = None

    def describe(self) -> str:
        """One line: slots used/total and bytes."""
        return (f"expert pool: {self.slots_used()}/{self.slots} slots + {self.staging} staging, "
                f"{format_size(self.bytes)}")


def _allocate(rows: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """``uint8 [rows, nbytes]`` on ``device``; an allocation failure becomes a ReconfigureError."""
    try:
        return torch.empty(rows, nbytes, dtype=torch.uint8, device=device)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ReconfigureError(
            f"allocating {format_size(rows * nbytes)} for the expert pool failed ({first[:120]}); "
            "lower expert_pool_size or free GPU memory") from None
