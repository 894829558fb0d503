"""Residency counters: hits, misses, prefetch outcomes, activations, without syncing for them.

When the ids of a layer are on the host anyway (a miss must be resolved), counting is plain Python.
When the pool holds every expert nothing is read back: activation and hit counts accumulate in
device tensors, and ``stats()`` reads them through a pinned buffer filled asynchronously by the
previous call, so a snapshot may lag by one call but never stalls the GPU.

Hits and misses count distinct experts per layer call: a layer whose 8 tokens route to 12 distinct
experts, 9 of them resident, counts 9 hits and 3 misses.
"""
from __future__ import annotations

import torch

from engine.experts.pool import ExpertPool
from engine.telemetry import ExpertStats
from kernels._triton import HAS_TRITON
from kernels.router import tally, tally_ref


class DeviceTally:
    """Activation counts ``[L, E]`` and hits ``[L]`` accumulated on the device."""

    def __init__(self, num_layers: int, num_experts: int, device: torch.device) -> None:
        self.device = device
        self.acts = torch.zeros(num_layers, num_experts, dtype=torch.int64, device=device)  # [L, E]
        self.hits = torch.zeros(num_layers, dtype=torch.int64, device=device)                # [L]
        n = num_layers * num_experts + num_layers
        pin = device.type == "cuda"
        self._host = torch.zeros(n, dtype=torch.int64, pin_memory=pin)
        self._last = torch.zeros(n, dtype=torch.int64)
        self._event: torch.cuda.Event | None = None
        self._tally = tally if device.type == "cuda" and HAS_TRITON else tally_ref

    def target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(acts [E], hits [1])`` of ``layer``: views a kernel may add one layer call's counts to."""
        return self.acts[layer], self.hits[layer:layer + 1]

    def add(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Count one layer call (``topk_ids [T, k]`` on the device), asynchronously: one launch on
        a GPU, where a decode step of a full pool runs it in every MoE layer."""
        self._tally(topk_ids, *self.target(layer))

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Latest completed ``(acts [L, E], hits [L])`` on the host; never waits for the device."""
        flat = torch.cat([self.acts.reshape(-1), self.hits])
        if self.device.type != "cuda":
            self._last = flat.clone()
        else:
            if self._event is not None and self._event.query():
                self._last = self._host.clone()
            if self._event is None or self._event.query():
                self._host.copy_(flat, non_blocking=True)
                self._event = torch.cuda.Event()
                self._event.record()
        n = self.acts.numel()
        return self._last[:n].view(self.acts.shape), self._last[n:]


class ResidencyCounters:
    """Everything ``ExpertManager.stats()`` reports, cumulative since construction."""

    def __init__(self, num_layers: int, num_experts: int, device: torch.device) -> None:
        self.num_experts = num_experts
        self.hits = 0
        self.misses = 0
        self.prefetch_hits = 0
        self.prefetch_wasted = 0
        self.host_syncs = 0
        self.sync_ms = 0.0
        self.step_end_ms = 0.0       # host time in end_step
        self.direct_bytes = 0        # expert bytes the kernels read from host memory (direct reads)
        self.fills = 0               # directly read experts admitted from the kernels' fill slots
        self.gathered = 0            # shared missing experts of direct-read steps copied in once (gather)
        self.extra_passes = 0        # passes beyond the first of layers whose misses outnumbered their slots
        self.misses_predicted = 0    # misses a prediction for their layer had named
        self.device_copy_bytes = 0   # expert bytes the GPU-side prefetch copied in
        self.layer_hits = [0] * num_layers
        self.layer_misses = [0] * num_layers
        self.acts = [[0] * num_experts for _ in range(num_layers)]            # [L][E] host-side counts
        self.device_tally = DeviceTally(num_layers, num_experts, device)

    def record(self, layer: int, ids_host: list[int], hits: int, misses: int) -> None:
        """One layer call resolved on the host: the expert id of each of its T*k assignments.

        Plain Python on purpose: this runs once per layer on the decode path, where a torch call
        on a few ids costs more than the counting."""
        self.hits += hits
        self.misses += misses
        self.layer_hits[layer] += hits
        self.layer_misses[layer] += misses
        row = self.acts[layer]
        for e in ids_host:
            row[e] += 1

    def snapshot(self, pool: ExpertPool) -> ExpertStats:
        """A frozen ExpertStats (device-side counts as of the previous call on CUDA)."""
        dev_acts, dev_hits = self.device_tally.read()
        dev_hits_l = dev_hits.tolist()
        hits_l = [h + d for h, d in zip(self.layer_hits, dev_hits_l)]
        rates = tuple(h / (h + m) if h + m else 1.0 for h, m in zip(hits_l, self.layer_misses))
        acts = (torch.tensor(self.acts, dtype=torch.int64) + dev_acts).tolist()
        return ExpertStats(
            hits=self.hits + int(sum(dev_hits_l)), misses=self.misses,
            prefetch_hits=self.prefetch_hits, prefetch_wasted=self.prefetch_wasted,
            h2d_bytes=pool.copies.bytes_copied + self.direct_bytes + self.device_copy_bytes,
            direct_bytes=self.direct_bytes,
            fills=self.fills, gathered=self.gathered, extra_passes=self.extra_passes, misses_predicted=self.misses_predicted,
            copy_wait_ms=pool.copies.poll(),
            pool_slots_used=pool.books.slots_used(), pool_slots_total=pool.slots, pool_bytes=pool.bytes,
            per_layer_hit_rate=rates, activations=tuple(tuple(r) for r in acts))
