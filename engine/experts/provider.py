"""The contract between the model's MoE layers and wherever the routed experts live.

The model asks the provider, layer by layer, for the experts its tokens were routed to; the
provider answers with a slot table ``[E] int32`` (expert -> slot, every needed expert valid) and
typed views ``[S, ...]`` of the buffer those slots index (see :mod:`kernels.expert_layout`). The MoE
kernels read weights through that pair and never gather a copy.

Implementations: :class:`ResidentExperts` (every expert in one device buffer) and the offloading
pool in :mod:`engine.experts.manager` (hot experts on the GPU, the rest in pinned host memory).
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from kernels.expert_layout import ExpertLayout
from engine.experts.replay import ReplayHooks
from engine.telemetry import ExpertStats


class ExpertProvider(Protocol):
    layout: ExpertLayout

    def begin_step(self) -> None:
        """A forward pass starts (one engine step)."""

    @property
    def static(self) -> bool:
        """True when the slot tables never change, so a whole decode step can be one CUDA graph."""

    def before_layer(self, moe_index: int, hidden: torch.Tensor) -> Any:
        """Layer ``moe_index`` is about to run on ``hidden [T, D]`` (prefetch hook); returns a
        prediction handle (or None) to pass to ``acquire``."""

    def acquire(self, moe_index: int, topk_ids: torch.Tensor,
                predicted: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Make the experts in ``topk_ids [T, k]`` usable; return ``(slot_of_expert [E] int32, views)``."""

    def end_step(self) -> None:
        """The forward pass is over (counters, eviction bookkeeping)."""

    def direct_for(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` tokens reads missing experts straight from host memory."""

    @property
    def replay_hooks(self) -> ReplayHooks | None:
        """What the decode-step CUDA graphs drive between pieces of a step; None: record it whole."""

    def settle(self) -> None:
        """End a step whose end was deferred (a replayed direct-read step), so its counts are in; the
        engine calls it when it runs out of work. Never needed for correctness."""

    def stats(self) -> ExpertStats:
        """Cumulative counters, without a device sync and without side effects."""

    def close(self) -> None:
        """Free what the provider holds on the device (and the host store it owns)."""


class ResidentExperts:
    """Every routed expert of every MoE layer in one buffer on the compute device (no offload)."""

    def __init__(self, layout: ExpertLayout, experts: torch.Tensor, num_experts: int) -> None:
        # experts: uint8 [L * E, nbytes], expert e of MoE layer l at row l * E + e
        self.layout = layout
        self.num_experts = num_experts
        self.buffer = experts
        self.views = layout.views(experts)
        n_layers = experts.shape[0] // num_experts
        base = torch.arange(num_experts, dtype=torch.int32, device=experts.device)
        self._slot_tables = [base + l * num_experts for l in range(n_layers)]
        self._counts = torch.zeros(n_layers, num_experts, dtype=torch.int64, device=experts.device)
        self._ones = torch.ones(1024, dtype=torch.int64, device=experts.device)

    static = True
    replay_hooks = None        # its tables never change: a decode step is recorded whole

    def direct_for(self, tokens: int) -> bool:
        return False             # nothing is missing

    def begin_step(self) -> None:
        pass

    def before_layer(self, moe_index: int, hidden: torch.Tensor) -> None:
        return None

    def acquire(self, moe_index: int, topk_ids: torch.Tensor,
                predicted: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # index_add_ rather than bincount: no device->host sync, so decode steps can be graph-captured
        ids = topk_ids.flatten()
        if self._ones.numel() < ids.numel():
            self._ones = torch.ones(ids.numel(), dtype=torch.int64, device=ids.device)
        self._counts[moe_index].index_add_(0, ids, self._ones[:ids.numel()])   # one launch per layer
        return self._slot_tables[moe_index], self.views

    def end_step(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass                     # the buffer belongs to the loaded model

    def stats(self) -> ExpertStats:
        n = self.buffer.shape[0]
        return ExpertStats(pool_slots_used=n, pool_slots_total=n, pool_bytes=self.buffer.numel(),
                           per_layer_hit_rate=tuple(1.0 for _ in self._slot_tables),
                           activations=tuple(tuple(r) for r in self._counts.cpu().tolist()))
