"""The contract between the model's MoE layers and wherever the routed experts live.

The model asks the provider, layer by layer, for the experts its tokens were routed to; the
provider answers with a slot table ``[E] int32`` (expert -> slot, every needed expert valid) and
typed views ``[S, ...]`` of the buffer those slots index (see :mod:`kernels.expert_layout`). The MoE
kernels read weights through that pair and never gather a copy.

The one implementation is :class:`engine.experts.manager.ExpertManager`: hot experts in a pool on the
GPU, the rest in pinned host memory — or, for a model whose experts all fit, a full pool over the
model's own buffer (static tables, no host copy until the pool is made smaller).
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from kernels.expert_layout import ExpertLayout
from engine.experts.replay import ReplayHooks
from engine.telemetry import ExpertStats


class ExpertProvider(Protocol):
    layout: ExpertLayout

    def begin_step(self, prompt: bool = False) -> None:
        """A forward pass starts (one engine step); ``prompt``: it carries a prompt's tokens (a prefill or
        a mixed step), whose routing may rank the experts a pool admits."""

    @property
    def static(self) -> bool:
        """True when the slot tables never change, so a whole decode step can be one CUDA graph."""

    def before_layer(self, moe_index: int, hidden: torch.Tensor) -> Any:
        """Layer ``moe_index`` is about to run on ``hidden [T, D]`` (prefetch hook); returns a
        prediction handle (or None) to pass to ``acquire``."""

    def route_tally(self, moe_index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where the router kernel of layer ``moe_index``'s next call may count it, ``(acts [E], hits [1])``
        int64 on the device, so that ``acquire`` need not launch a count of its own; None: ``acquire``
        counts (or the call is counted on the host)."""

    def acquire(self, moe_index: int, topk_ids: torch.Tensor,
                predicted: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Make the experts in ``topk_ids [T, k]`` usable; return ``(slot_of_expert [E] int32, views)``."""

    def end_step(self) -> None:
        """The forward pass is over (counters, eviction bookkeeping)."""

    def eager_for(self, tokens: int, recorded: int | None = None) -> bool:
        """Whether a decode step of ``tokens`` tokens should run eagerly, not replayed from a CUDA
        graph (recorded for ``recorded`` tokens, default ``tokens``), so that the host can give
        missing experts to the CPU (the host decides per layer)."""

    def observe_step(self, tokens: int, eager: bool, seconds: float, recorded: int | None = None) -> None:
        """A decode step of ``tokens`` tokens took ``seconds`` (launch to sampled tokens on the host);
        ``recorded``: the size of the recording it replayed."""

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

    def check_reconfigure(self, pool_bytes: int | None = None, prefetch_depth: int | None = None,
                          policy: str | None = None, reads: str | None = None, cold: str | None = None) -> str:
        """Raise ReconfigureError when ``reconfigure`` would refuse these settings; changes nothing."""

    def reconfigure(self, pool_bytes: int | None = None, prefetch_depth: int | None = None,
                    policy: str | None = None, reads: str | None = None, cold: str | None = None) -> str:
        """Apply live settings between steps (None: unchanged); a short description of the result."""

    def close(self) -> None:
        """Free what the provider holds on the device (and the host store it owns)."""
