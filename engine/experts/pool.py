"""Device expert pool: ``uint8 [S + R, nbytes]`` slots and the ``[L, E]`` slot table.

Slots ``0..S-1`` are the pool proper, owned by the eviction policy. Slots ``S..S+R-1`` are
staging slots: an expert that gets no pool slot (a pool of 0 slots, or every pool slot pinned, or
a static placement that excludes it) is copied into one, leased to the layer that needs it, and
released once that layer is past. ``R`` is ``staging`` (default ``2 E``: the current layer's misses
plus prefetches for the next ones; at least ``E``, as a prefill chunk may miss every expert of a layer),
and 0 when the pool holds every expert.

The slot table maps (layer, expert) -> slot or -1. Its host mirror, and what every slot holds, are the
pool's ``books`` (engine/experts/residency_books.py); row ``l`` of the device table is pushed when
layer ``l`` acquires its experts, which is the only time a kernel reads it.

Resizing frees the old buffer before allocating the new one and then copies the kept experts
back from the host store: the transient peak is max(old, new) rather than old + new, so a grow
never needs more than its own size of free memory. A failed allocation re-creates the old pool.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

import torch

from engine.config import format_size
from engine.errors import ReconfigureError
from engine.experts.prefetch import CopyEngine
from engine.experts.residency_books import ResidencyBooks
from engine.experts.store import HostExpertStore
from engine.host_copy import host_to
from kernels.expert_layout import ExpertLayout


class ExpertPool:
    """Slots on the compute device and the slot table; what each slot holds is in ``books``
    (:class:`engine.experts.residency_books.ResidencyBooks`)."""

    def __init__(self, store: HostExpertStore, device: torch.device, slots: int,
                 keep: Iterable[int] = (), budget_bytes: int | None = None, staging: int | None = None) -> None:
        self._setup(store, device, store.layout, store.num_layers, store.num_experts, budget_bytes, staging)
        self.resize(slots, keep)

    @classmethod
    def adopting(cls, buffer: torch.Tensor, layout: ExpertLayout, num_experts: int,
                 budget_bytes: int | None = None, staging: int | None = None) -> "ExpertPool":
        """A full pool whose buffer is ``buffer`` (``uint8 [L * E, layout.nbytes]`` on its device, key k
        in slot k), taken over without a copy: a model whose experts all fit. It has no host store
        until :meth:`give_store`, and cannot shrink before."""
        pool = cls.__new__(cls)
        pool._setup(None, buffer.device, layout, buffer.shape[0] // num_experts, num_experts, budget_bytes, staging)
        n = pool.num_keys
        pool.buffer, pool.views = buffer, layout.views(buffer)
        pool.books.reset(n, n, [(k, k) for k in range(n)])
        pool.table.copy_(torch.arange(n, dtype=torch.int32).view(pool.num_layers, num_experts))
        pool.books.stale.clear()
        return pool

    def _setup(self, store: HostExpertStore | None, device: torch.device, layout: ExpertLayout, num_layers: int,
               num_experts: int, budget_bytes: int | None, staging: int | None = None) -> None:
        if staging is not None and staging < 1:
            raise ValueError(f"{staging} staging slots: a layer's missing experts need at least one "
                             "(engine/memory.staging_slots sizes them)")
        self.store, self.layout = store, layout
        self.staging_size = 2 * num_experts if staging is None else staging
        self.device = device
        self.num_layers, self.num_experts = num_layers, num_experts
        self.num_keys = num_layers * num_experts
        self.nbytes = layout.nbytes
        self.budget_bytes = budget_bytes
        self.copies = CopyEngine(device)
        self.table = torch.full((num_layers, num_experts), -1, dtype=torch.int32, device=device)
        self.books = ResidencyBooks(num_layers, num_experts)
        self.buffer: torch.Tensor | None = None
        self.views: dict[str, torch.Tensor] | None = None

    def give_store(self, store: HostExpertStore) -> None:
        """The host store that holds every expert from now on (an adopted pool's, before it may shrink)."""
        if store.layout != self.layout or store.rows.shape[0] != self.num_keys:
            raise ValueError(f"a store of {store.rows.shape[0]} {store.layout.fmt} rows does not match this pool "
                             f"of {self.num_keys} {self.layout.fmt} experts")
        self.store = store

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Pool slots (staging excluded)."""
        return self.books.slots

    @property
    def staging(self) -> int:
        """Staging slots."""
        return self.books.staging

    @property
    def full(self) -> bool:
        """Every expert of every layer has a pool slot (static table, no misses possible)."""
        return self.books.full

    @property
    def bytes(self) -> int:
        """Device bytes of the whole buffer, staging included."""
        return 0 if self.buffer is None else self.buffer.numel()

    def staging_for(self, slots: int) -> int:
        """Staging slots that go with a pool of ``slots`` slots."""
        return 0 if slots >= self.num_keys else self.staging_size

    # ---- device work -------------------------------------------------------------------------
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
        books = self.books
        if layer in books.stale:
            books.stale.discard(layer)
            lo = layer * self.num_experts
            self.table[layer].copy_(host_to(books.slot_of[lo:lo + self.num_experts], torch.int32, self.device))
        return self.table[layer]

    def push_stale(self) -> None:
        """Send every changed row (before kernels that read the device table as it is)."""
        for layer in sorted(self.books.stale):
            self.push_row(layer)

    def write_table(self, keys: list[int], values: list[int], stream: "torch.cuda.Stream | None") -> None:
        """Device slot-table entries ``keys`` <- ``values`` on ``stream`` (None: the current one); the
        books are the caller's."""
        if not keys:
            return
        cuda = self.device.type == "cuda"
        with torch.cuda.stream(stream or torch.cuda.current_stream(self.device)) if cuda else contextlib.nullcontext():
            self.table.view(-1).index_copy_(0, host_to(keys, torch.int64, self.device),
                                            host_to(values, torch.int32, self.device))

    # ---- resize ------------------------------------------------------------------------------
    def resize(self, slots: int, keep: Iterable[int]) -> None:
        """Re-create the pool with ``slots`` slots holding the first ``slots`` of ``keep``.

        A pool holding every expert places key k in slot k (a static table). Raises
        ReconfigureError, leaving the pool as it was, when the size is over the budget or the
        allocation fails. Must be called between steps (no staging lease outstanding).
        """
        slots = max(0, min(int(slots), self.num_keys))
        if self.store is None:
            raise ReconfigureError("this expert pool has no host store to offload to; it cannot be resized")
        self.check_size(slots)
        total = slots + self.staging_for(slots)
        old_owner, old_slots = list(self.books.owner), self.books.slots
        self.copies.synchronize()                          # nothing may still write the old buffer
        self.buffer = self.views = None                      # drop the old buffer before allocating
        try:
            buffer = allocate_slots(total, self.nbytes, self.device)
        except ReconfigureError:
            self._rebuild(allocate_slots(len(old_owner), self.nbytes, self.device), old_slots,
                          [(s, k) for s, k in enumerate(old_owner[:old_slots]) if k >= 0])
            raise
        kept = list(range(self.num_keys)) if slots >= self.num_keys else list(keep)[:slots]
        self._rebuild(buffer, slots, list(enumerate(kept)))

    def check_size(self, slots: int) -> None:
        """Raise ReconfigureError when a pool of ``slots`` slots and its staging is over the budget."""
        slots = max(0, min(int(slots), self.num_keys))
        total = slots + self.staging_for(slots)
        if self.budget_bytes is not None and total * self.nbytes > self.budget_bytes:
            raise ReconfigureError(
                f"an expert pool of {slots} slots plus {total - slots} staging slots needs "
                f"{format_size(total * self.nbytes)} but the GPU memory budget leaves "
                f"{format_size(self.budget_bytes)} for it; lower expert_pool_size or raise gpu_memory_budget")

    def _rebuild(self, buffer: torch.Tensor, slots: int, placed: list[tuple[int, int]]) -> None:
        self.buffer = buffer
        self.views = self.layout.views(buffer)        # typed per-slot views, rebuilt with the buffer
        self.books.reset(slots, buffer.shape[0], placed)
        self.load(placed, demand=False)
        self.copies.join()
        self.table.copy_(torch.tensor(self.books.slot_of, dtype=torch.int32).view(self.num_layers, self.num_experts))
        self.books.stale.clear()

    def close(self) -> None:
        """Free the device buffer once every copy into it is done."""
        self.copies.synchronize()
        self.buffer = self.views = None

    def describe(self) -> str:
        """One line: slots used/total and bytes."""
        return (f"expert pool: {self.books.slots_used()}/{self.slots} slots + {self.staging} staging, "
                f"{format_size(self.bytes)}")


def allocate_slots(rows: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """``uint8 [rows, nbytes]`` on ``device``; an allocation failure becomes a ReconfigureError."""
    try:
        return torch.empty(rows, nbytes, dtype=torch.uint8, device=device)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ReconfigureError(
            f"allocating {format_size(rows * nbytes)} for the expert pool failed ({first[:120]}); "
            "lower expert_pool_size or free GPU memory") from None
