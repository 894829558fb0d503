"""``Residency``: the parts both residency paths work on, each owning its own state.

:class:`engine.experts.manager.ExpertManager` builds one and hands it to the copy path
(engine/experts/copy_path.py) and the direct path (engine/experts/direct.py). Nothing here keeps
per-step state: the pool's books say what is where, the ledger what prefetches became, the counters
what happened; the manager's :class:`engine.experts.step_plan.StepPlan` says what kind of step runs.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from engine.experts.books import MissForecast, PrefetchLedger
from engine.experts.cold import ColdExperts, ColdShare
from engine.experts.counters import ResidencyCounters
from engine.experts.policy import EvictionPolicy
from engine.experts.pool import ExpertPool
from engine.experts.prefetch import PrefetchGate
from engine.experts.readback import HostReader
from engine.experts.residency_books import ResidencyBooks
from engine.experts.store import HostExpertStore
from engine.experts.tuning import ResidencyTuning
from kernels.expert_layout import ExpertLayout


@dataclasses.dataclass(eq=False)
class Residency:
    layout: ExpertLayout
    store: HostExpertStore | None   # None: every expert resident, no host copy made yet
    pool: ExpertPool
    policy: EvictionPolicy           # replaced by a live change of the policy
    counters: ResidencyCounters
    ledger: PrefetchLedger           # unused prefetches; counts their hits and waste
    forecast: MissForecast           # which misses a prediction had named
    gate: PrefetchGate               # look-ahead distances whose guesses are mostly right
    tuning: ResidencyTuning          # a caller may replace it between steps
    reader: HostReader               # device -> host reads of routing ids
    prefetch_depth: int              # the live setting (the gate may use less in a step)
    cold: ColdExperts                # which missing experts the host CPU computes (the cost model)
    # the pool's, fixed for its life (a resize rebuilds the same books in place); plain attributes,
    # since the host reads them for every layer of every step
    books: ResidencyBooks = dataclasses.field(init=False)
    device: torch.device = dataclasses.field(init=False)
    num_layers: int = dataclasses.field(init=False)
    num_experts: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        pool = self.pool
        self.books, self.device = pool.books, pool.device
        self.num_layers, self.num_experts = pool.num_layers, pool.num_experts

    def gated_depth(self) -> int:
        """The look-ahead the gate allows now (at most the setting)."""
        return self.gate.depth(self.prefetch_depth)

    def cold_share(self, moe_index: int, ids: list[int], missing: list[bool], k: int,
                   direct: bool, by_kernels: bool = False) -> ColdShare | None:
        """The host CPU's share of layer ``moe_index`` (None: none, or the setting keeps every expert
        on the bus): ``ids`` its T*k expert ids, ``missing`` per pair whether that expert has no slot
        the kernels will find; ``direct``: the rest is read directly (once per token); ``by_kernels``:
        the GPU's kernels carry the rest (a direct-read step: direct reads or the gather's copies)."""
        if self.store is None or not self.cold.enabled_on(self.device):
            return None
        return self.cold.split(self.store.rows, self.device, moe_index, self.num_experts, ids, missing, k, direct,
                               by_kernels)

    def evict(self, key: int) -> None:
        """Take ``key`` out of its pool slot (the policy forgets it; an unused prefetch is waste)."""
        self.books.unassign(self.books.slot_of[key])
        self.policy.remove(key)
        self.ledger.waste(key)

    def drop_staging(self, slot: int) -> None:
        """Release a staging slot; an unused prefetch in it is waste."""
        key = self.books.release_staging(slot)
        self.books.prefetched.pop(key, None)
        self.ledger.waste(key)

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (int64 [N] on the device) on the host: one counted sync, the policy catching up meanwhile."""
        return self.waited(lambda: self.reader.read(t))

    def waited(self, wait):
        """``wait()``'s result, counted as one host sync and its time, the policy catching up first
        (the GPU computes meanwhile)."""
        self.policy.catch_up()
        self.counters.host_syncs += 1
        t0 = time.perf_counter()
        out = wait()
        self.counters.sync_ms += (time.perf_counter() - t0) * 1e3
        return out

    def count_uses(self, moe_index: int, keys: list[int], found: dict[int, int] | None) -> None:
        """The prefetches among a layer's ``keys`` are settled: used from their slot (a hit, credited to
        the distance they were guessed at) or not. ``found``: the slot each key's layer found it in
        (direct reads, where a copy still on the bus counts as unused); None: the books' slots (copies)."""
        unused = self.ledger.unused
        if not unused:
            return
        slot_of = self.books.slot_of
        for k in keys:
            if k not in unused or (found is None and slot_of[k] < 0):
                continue
            distance = self.ledger.take(k)
            hit = found is None or found[k] >= 0
            self.ledger.count(hit)
            if hit:
                self.gate.on_use(distance)
