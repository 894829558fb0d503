"""Builders shared by the kernel tests: experts packed into a pool with a scrambled slot table."""
from __future__ import annotations

import torch

from kernels.expert_layout import ExpertLayout
from kernels.quant import quantize_expert

# Per activation dtype: kernels and reference round the intermediate h to this dtype at different
# points, so fp16 carries its rounding error (~1e-3 relative) into the result.
TOLERANCES = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=4e-3, rtol=1e-2)}


def tolerance(fmt: str, dtype: torch.dtype) -> dict:
    """``assert_close`` bounds for a MoE output: the int4 decode kernels take their activations as
    16-bit fixed point per group (off by up to 1/65534 of the group's largest), which float32 inputs
    notice."""
    if fmt in ("int4", "mxfp4") and dtype == torch.float32:
        return dict(atol=5e-4, rtol=5e-4)
    return TOLERANCES[dtype]


def make_pool(fmt: str, hidden: int, ffn: int, experts: int, group_size: int = 32, extra_slots: int = 2,
              seed: int = 0) -> tuple[ExpertLayout, torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """A pool of ``experts + extra_slots`` slots holding random experts at a permuted slot table.

    Unused slots are filled with large garbage so a kernel that reads the wrong slot fails loudly.
    """
    g = torch.Generator().manual_seed(seed)
    layout = ExpertLayout.make(fmt, hidden, ffn, group_size)
    slots_total = experts + extra_slots
    buf = torch.randint(0, 255, (slots_total, layout.nbytes), dtype=torch.uint8, generator=g)
    slot_of_expert = torch.randperm(slots_total, generator=g)[:experts].to(torch.int32)
    for e in range(experts):
        w13 = torch.randn(2 * ffn, hidden, generator=g) / hidden ** 0.5
        w2 = torch.randn(hidden, ffn, generator=g) / ffn ** 0.5
        layout.pack(quantize_expert(w13, w2, layout), buf[int(slot_of_expert[e])])
    return layout, buf, layout.views(buf), slot_of_expert


def make_routing(tokens: int, experts: int, top_k: int, used: int | None = None,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random distinct top-k ids drawn from the first ``used`` experts, and positive weights."""
    g = torch.Generator().manual_seed(seed)
    pool = used or experts
    ids = torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, top_k, generator=g) + 0.1
    return ids, weights
