"""``ResidencyBooks``: which expert is in which device slot — pure Python, no tensors, no streams.

The device pool (engine/experts/pool.py) is ``S`` pool slots and ``R`` staging slots over one buffer.
These books say, on the host, what every slot holds and who may take it:

* ``slot_of[key]`` — the slot of key ``layer * E + expert``, or -1 (the host mirror of the device
  slot table); ``owner[slot]`` — the key a slot holds, or -1.
* ``free`` — empty pool slots (owned by the eviction policy once filled); ``staging_free`` — empty
  staging slots; ``lease[slot]`` — the layer a staging slot was taken for (-1: for the whole step).
* pins — keys no eviction may take now: the experts of the layer being computed (``current``) and
  every prefetched expert until its layer has run (``prefetched``: key -> that layer).
* ``stale`` — layers whose device table row differs from ``slot_of`` (the pool pushes them).

The pool changes these only through the methods below; so do the two residency paths.
"""
from __future__ import annotations

from typing import Iterable


class ResidencyBooks:
    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.num_layers, self.num_experts = num_layers, num_experts
        self.num_keys = num_layers * num_experts
        self.slots, self.staging = 0, 0
        self.full = False                         # every key has a pool slot (a static table)
        self.slot_of = [-1] * self.num_keys
        self.owner: list[int] = []
        self.free: list[int] = []                 # free pool slots, lowest last (popped first)
        self.staging_free: list[int] = []
        self.lease: dict[int, int] = {}           # staging slot -> layer it was taken for
        self.stale: set[int] = set()
        self.current: set[int] = set()            # keys of the layer being computed
        self.prefetched: dict[int, int] = {}      # key -> layer it was fetched for, pinned until then

    def reset(self, slots: int, total: int, placed: Iterable[tuple[int, int]]) -> None:
        """Start over with ``slots`` pool slots of ``total`` and ``(slot, key)`` already placed; every
        layer's row is stale, no lease or pin is held."""
        self.slots, self.staging = slots, total - slots
        self.full = slots >= self.num_keys
        self.owner = [-1] * total
        self.slot_of = [-1] * self.num_keys
        used = set()
        for slot, key in placed:
            self.assign(key, slot)
            used.add(slot)
        self.free = [s for s in range(slots - 1, -1, -1) if s not in used]
        self.staging_free = list(range(total - 1, slots - 1, -1))
        self.lease = {}
        self.current, self.prefetched = set(), {}

    # ---- what is where -----------------------------------------------------------------------
    def slots_used(self) -> int:
        """Pool slots holding an expert."""
        return self.slots - len(self.free)

    def resident_keys(self) -> list[int]:
        """Keys holding a pool slot (staging excluded)."""
        return [k for k in self.owner[:self.slots] if k >= 0]

    def resident_slot(self, key: int) -> int:
        """The pool slot of ``key``, or -1 (not resident, or only in staging)."""
        slot = self.slot_of[key]
        return slot if 0 <= slot < self.slots else -1

    def is_pool_slot(self, slot: int) -> bool:
        return slot < self.slots

    # ---- slots -------------------------------------------------------------------------------
    def assign(self, key: int, slot: int) -> None:
        self.slot_of[key] = slot
        self.owner[slot] = key
        self.stale.add(key // self.num_experts)

    def unassign(self, slot: int) -> int:
        """Empty ``slot``; returns the key it held (-1: none)."""
        key = self.owner[slot]
        self.owner[slot] = -1
        if key >= 0:
            self.slot_of[key] = -1
            self.stale.add(key // self.num_experts)
        return key

    def take_free(self) -> int | None:
        return self.free.pop() if self.free else None

    def take_staging(self, layer: int) -> int | None:
        """Lease a free staging slot to ``layer`` (-1: to the whole step), or None if none is free."""
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

    def leased_before(self, layer: int) -> list[int]:
        """Staging slots leased to layers before ``layer`` (whole-step leases, -1, included)."""
        return [s for s, j in self.lease.items() if j < layer]

    # ---- pins --------------------------------------------------------------------------------
    @property
    def pins(self) -> set[int]:
        """Keys no eviction may take now: the current layer's experts and every prefetched one."""
        return self.current | self.prefetched.keys()

    def layer_ran(self, layer: int) -> None:
        """``layer`` has acquired its experts: prefetches made for it (or earlier) are pins no more."""
        for k in [k for k, j in self.prefetched.items() if j <= layer]:
            del self.prefetched[k]

    def forget_pins(self) -> None:
        self.current = set()
        self.prefetched.clear()
