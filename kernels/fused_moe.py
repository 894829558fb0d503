"""Routed-expert MoE: out[t] = sum_j w[t, j] * down(silu(gate(x[t])) * up(x[t])) over the top-k experts.

Weights are read through the slot table (expert -> pool slot) from the typed pool views of
:class:`engine.experts.layout.ExpertLayout`; nothing is gathered.

Legend: T tokens, k experts per token, E experts, S pool slots, D hidden, F expert FFN.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.experts.layout import ExpertLayout


def expert_weights_ref(views: dict[str, torch.Tensor], slot: int, layout: ExpertLayout,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``(w13 [2F, D], w2 [D, F])`` of the expert in ``slot``, in ``dtype``."""
    if layout.fmt in ("bf16", "fp16", "fp32"):
        return views["w13"][slot].to(dtype), views["w2"][slot].to(dtype)
    from engine.quant import dequantize_expert_matrix  # int4 / fp8
    return (dequantize_expert_matrix(views, "w13", slot, layout, dtype),
            dequantize_expert_matrix(views, "w2", slot, layout, dtype))


def fused_moe_ref(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  slot_of_expert: torch.Tensor, views: dict[str, torch.Tensor],
                  layout: ExpertLayout) -> torch.Tensor:
    """Plain-torch MoE over experts in a pool.

    x [T, D] (float), topk_ids [T, k] (int, expert ids), topk_weights [T, k] (float),
    slot_of_expert [E] int32. Returns [T, D] in x.dtype; accumulates in float32.
    Experts are visited in ascending id order, so the result does not depend on slot placement.
    """
    T, D = x.shape
    out = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.flatten()                                    # [T*k]
    order = torch.argsort(flat_ids, stable=True)                     # [T*k]
    counts = torch.bincount(flat_ids, minlength=slot_of_expert.numel()).tolist()
    slots = slot_of_expert.tolist()
    tok_of = order // topk_ids.shape[1]                              # [T*k] token of each sorted pair
    w_sorted = topk_weights.flatten()[order].to(torch.float32)       # [T*k]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        toks = tok_of[start:start + n]                               # [n]
        w13, w2 = expert_weights_ref(views, slots[e], layout, x.dtype)
        h = x[toks] @ w13.t()                                        # [n, 2F]
        f = w13.shape[0] // 2
        h = F.silu(h[:, :f]) * h[:, f:]                              # [n, F]
        y = (h @ w2.t()).to(torch.float32)                           # [n, D]
        out.index_add_(0, toks, y * w_sorted[start:start + n, None])
        start += n
    return out.to(x.dtype)
