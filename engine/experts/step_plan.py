"""``StepPlan``: what kind of step the expert residency runs, decided once when the step's first MoE
layer arrives (or its replay is set up) and read, never changed, until the step ends.

The manager (engine/experts/manager.py) keeps the running step's plan in ``plan`` (None between
steps, and in a step whose first layer has not come yet) and dispatches on it: every layer of a
step goes the same way. A live change, a recorded graph or the next step makes a new plan.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

Kind = Literal["copy", "direct", "captured"]


@dataclasses.dataclass(frozen=True)
class StepPlan:
    # How this step's missing experts reach the kernels:
    #   "copy"     — copied into pool or staging slots before their layer computes (one host read of
    #                the layer's ids per layer, or ids published by a recorded graph piece);
    #   "direct"   — the MoE kernels read them straight from mapped host memory; the host follows;
    #   "captured" — a direct-read step being recorded into a CUDA graph (device work only; the
    #                host follows each replay instead).
    kind: Kind
    # Tokens of the step (rows of the layers' routing ids); 0 when not known (a recorded step).
    tokens: int = 0
    # The step carries a prompt's tokens (a prefill or a mixed step: ``begin_step(prompt=True)``).
    prompt: bool = False
    # The step's end may wait until the next step is launched (a replayed direct-read step, or an
    # eager one when ``defer_eager_ends`` is set), so the host's step-end work overlaps the GPU's.
    defer_end: bool = False

    def with_deferred_end(self) -> "StepPlan":
        return dataclasses.replace(self, defer_end=True)
