"""Measured cost of computing one expert on the CPU, for the scheduler's cost model.

The scheduler weighs, per missing expert, the bus (bytes / bus GB/s) against the CPU (seconds for
that expert at the step's token count on it). :func:`calibrate` measures the latter on the real
store and threads in a fraction of a second; :class:`CpuExpertCost` answers for any token count.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numba
import torch

from kernels.cpu.forward import CpuExpertWork, cpu_expert_forward
from kernels.expert_layout import ExpertLayout


@dataclass(frozen=True)
class CpuExpertCost:
    """Seconds to compute one expert on the CPU, by the number of tokens routed to it."""

    fmt: str
    nbytes: int                          # bytes of one expert (what the CPU streams)
    threads: int
    tokens: tuple[int, ...]              # token counts measured, ascending
    seconds: tuple[float, ...]           # per expert, per call of `experts_per_call` experts
    experts_per_call: int

    def seconds_for(self, tokens: int) -> float:
        """Seconds per expert at ``tokens`` tokens: linear between measured counts, and beyond the
        largest along the slope of the last two."""
        ts, ss = self.tokens, self.seconds
        if tokens <= ts[0] or len(ts) == 1:
            return ss[0] if tokens <= ts[0] else ss[0] * tokens / ts[0]
        for i in range(1, len(ts)):
            if tokens <= ts[i]:
                f = (tokens - ts[i - 1]) / (ts[i] - ts[i - 1])
                return ss[i - 1] + f * (ss[i] - ss[i - 1])
        slope = (ss[-1] - ss[-2]) / (ts[-1] - ts[-2])
        return ss[-1] + slope * (tokens - ts[-1])

    def gbps(self, tokens: int = 1) -> float:
        """Expert bytes streamed per second at ``tokens`` tokens."""
        return self.nbytes / self.seconds_for(tokens) / 1e9


def calibrate(store: torch.Tensor, layout: ExpertLayout, rows: Sequence[int], tokens: Sequence[int] = (1, 2, 4, 8),
              threads: int | None = None, repeats: int = 3) -> CpuExpertCost:
    """Time :func:`cpu_expert_forward` over store ``rows`` (several distinct experts, ideally more
    bytes than the last-level cache, as a decode step meets them) at each count in ``tokens``; the
    best of ``repeats`` per count, divided by ``len(rows)``. The first call compiles (or loads the
    cached kernel) and is not timed."""
    if not rows:
        raise ValueError("calibrate needs at least one store row to time")
    tokens = tuple(sorted(set(int(t) for t in tokens)))
    x = torch.randn(tokens[-1], layout.hidden)
    out = torch.empty(tokens[-1], layout.hidden)
    seconds = []
    for t in tokens:
        work = CpuExpertWork.from_pairs([(r, list(range(t)), [1.0] * t) for r in rows])
        cpu_expert_forward(store, layout, work, x[:t], out[:t], threads)
        best = float("inf")
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            cpu_expert_forward(store, layout, work, x[:t], out[:t], threads)
            best = min(best, time.perf_counter() - t0)
        seconds.append(best / len(rows))
    return CpuExpertCost(layout.fmt, layout.nbytes, numba.get_num_threads(), tokens, tuple(seconds), len(rows))
