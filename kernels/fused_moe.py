"""Routed-expert MoE: out[t] = sum_j w[t, j] * down(act(gate(x[t]), up(x[t]))) over the top-k experts
(act: silu(gate) * up, or gpt-oss's clamped SwiGLU; each projection plus its bias where the layout
has them).

Weights are read through the slot table (expert -> pool slot) from the typed pool views of
:class:`kernels.expert_layout.ExpertLayout`; nothing is gathered.

:func:`fused_moe` is the Triton path (CUDA, or the interpreter in tests): a decode variant for a few
tokens (:mod:`kernels.moe_decode`) and an aligned-block prefill variant (:mod:`kernels.moe_prefill`),
chosen with their tile sizes by :mod:`kernels.moe_config`. The decode variant sums over k inside its
down kernel; the prefill variant writes each pair's weighted output to a float32 buffer ``[T, k, D]``
summed afterwards. Both are deterministic (no atomics) and free of host syncs, so the call can be
captured in a CUDA graph. fp32 activations use TF32 tensor cores in the prefill
variant on a GPU. :func:`fused_moe_ref` is the plain-torch path (CPU) and the reference.

Legend: T tokens, k experts per token, E experts, S pool slots, D hidden, F expert FFN.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from kernels.expert_layout import ExpertAct, ExpertLayout
from kernels.act16 import Act16
from kernels.moe_config import MoeLaunchConfig, moe_launch_config
from kernels.moe_weights import HostExperts
from kernels.moe_decode_common import SLOT_CPU


def expert_weights_ref(views: dict[str, torch.Tensor], slot: int, layout: ExpertLayout,
                       dtype: torch.dtype, host: HostExperts | None = None,
                       expert: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``(w13 [2F, D], w2 [D, F])`` of the expert in ``slot``, in ``dtype``; with ``host`` and
    slot -1, of store row ``host.row_base + expert`` (the direct read the kernels make).
    :func:`expert_ref` also gives the biases."""
    w13, w2, _ = expert_ref(views, slot, layout, dtype, host, expert)
    return w13, w2


def expert_ref(views: dict[str, torch.Tensor], slot: int, layout: ExpertLayout, dtype: torch.dtype,
               host: HostExperts | None = None, expert: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """``(w13, w2, biases)`` of one expert as :func:`expert_weights_ref` reads it; ``biases`` is
    ``(b13 [2F], b2 [D])`` float32 when ``layout.bias``, else None."""
    if slot < 0:
        if host is None:
            raise ValueError(f"expert {expert} has no pool slot and no host store was given to read it from")
        fill = -1 if host.fill is None else int(host.fill[expert])
        if fill >= 0:  # as the kernels do: the expert read is also written into its fill slot
            for name, v in views.items():
                v[fill].copy_(host.views[name][host.row_base + expert])
        views, slot = host.views, host.row_base + expert
    biases = (views["w13_bias"][slot], views["w2_bias"][slot]) if layout.bias else None
    if layout.fmt in ("bf16", "fp16", "fp32"):
        return views["w13"][slot].to(dtype), views["w2"][slot].to(dtype), biases
    from kernels.quant import dequantize_expert_matrix  # int4 / fp8 / mxfp4
    return (dequantize_expert_matrix(views, "w13", slot, layout, dtype),
            dequantize_expert_matrix(views, "w2", slot, layout, dtype), biases)


def expert_act_ref(h: torch.Tensor, act: ExpertAct) -> torch.Tensor:
    """``h [n, 2F]`` (gate columns, then up) -> ``[n, F]`` as ``act`` combines them."""
    f = h.shape[1] // 2
    gate, up = h[:, :f], h[:, f:]
    if act.kind == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=act.limit)
    up = up.clamp(-act.limit, act.limit)
    return (up + 1) * gate * torch.sigmoid(gate * act.alpha)


def _expert_out(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                biases: tuple[torch.Tensor, torch.Tensor] | None, act: ExpertAct) -> torch.Tensor:
    """One expert on rows ``x [n, D]`` -> ``[n, D]`` float32."""
    h = x @ w13.t()                                                  # [n, 2F]
    if biases is not None:
        h = h + biases[0].to(h.dtype)
    y = expert_act_ref(h, act) @ w2.t()                              # [n, D]
    if biases is not None:
        y = y + biases[1].to(y.dtype)
    return y.to(torch.float32)


def fused_moe_ref(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  slot_of_expert: torch.Tensor, views: dict[str, torch.Tensor],
                  layout: ExpertLayout, host: HostExperts | None = None) -> torch.Tensor:
    """Plain-torch MoE over experts in a pool.

    x [T, D] (float), topk_ids [T, k] (int, expert ids), topk_weights [T, k] (float),
    slot_of_expert [E] int32 (-1: read from ``host``; ``SLOT_CPU``: the host CPU computes that expert's
    pairs, which add nothing here). Returns [T, D] in x.dtype; accumulates in float32. Experts are
    visited in ascending id order, so the result does not depend on slot placement.
    """
    T, D = x.shape
    out = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    if T == 1:
        return _one_token_ref(x, topk_ids, topk_weights, slot_of_expert, views, layout, out, host)
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
        if slots[e] == SLOT_CPU:
            start += n
            continue
        toks = tok_of[start:start + n]                               # [n]
        w13, w2, biases = expert_ref(views, slots[e], layout, x.dtype, host, e)
        y = _expert_out(x[toks], w13, w2, biases, layout.act)        # [n, D]
        out.index_add_(0, toks, y * w_sorted[start:start + n, None])
        start += n
    return out.to(x.dtype)


def _one_token_ref(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                   slot_of_expert: torch.Tensor, views: dict[str, torch.Tensor], layout: ExpertLayout,
                   out: torch.Tensor, host: HostExperts | None) -> torch.Tensor:
    """The decode case without sorting or index tables: same arithmetic, same (ascending id) order."""
    ids = topk_ids[0].tolist()
    slots = slot_of_expert[topk_ids[0]].tolist()
    w = topk_weights[0].to(torch.float32)                            # [k]
    for j in sorted(range(len(ids)), key=ids.__getitem__):
        if slots[j] == SLOT_CPU:
            continue
        w13, w2, biases = expert_ref(views, slots[j], layout, x.dtype, host, ids[j])
        out += _expert_out(x, w13, w2, biases, layout.act) * w[j]
    return out.to(x.dtype)


@lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _check_inputs(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  slot_of_expert: torch.Tensor, layout: ExpertLayout) -> None:
    if x.dim() != 2 or x.shape[1] != layout.hidden or x.dtype not in (torch.bfloat16, torch.float16,
                                                                      torch.float32):
        raise ValueError(f"x must be bf16/fp16/fp32 [T, {layout.hidden}], got {x.dtype} {tuple(x.shape)}")
    if x.stride(1) != 1:
        raise ValueError("x must have contiguous rows (stride(1) == 1)")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.dtype not in (torch.int32,
                                                                                       torch.int64):
        raise ValueError(f"topk_ids must be int32/int64 [{x.shape[0]}, k], got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be float {tuple(topk_ids.shape)}, got {topk_weights.dtype} "
                         f"{tuple(topk_weights.shape)}")
    if slot_of_expert.dim() != 1 or slot_of_expert.dtype != torch.int32:
        raise ValueError(f"slot_of_expert must be int32 [E], got {slot_of_expert.dtype} "
                         f"{tuple(slot_of_expert.shape)}")
    for t in (topk_ids, topk_weights, slot_of_expert):
        if t.device != x.device:
            raise ValueError(f"all MoE inputs must be on {x.device}; one is on {t.device}")


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              slot_of_expert: torch.Tensor, views: dict[str, torch.Tensor], layout: ExpertLayout,
              config: MoeLaunchConfig | None = None, host: HostExperts | None = None,
              x16: Act16 | None = None) -> torch.Tensor:
    """Triton MoE, same contract as :func:`fused_moe_ref`; ``[T, D]`` in ``x.dtype``.

    ``host``: experts whose slot is -1 are read straight from the (mapped) host store. Only the
    decode variant can, so it runs whatever the token count (the engine reads directly only for
    decode steps of a few tokens: ``ResidencyTuning.direct_max_tokens`` in engine/experts/tuning.py).
    Formats bf16/fp16/fp32, fp8, int4 and mxfp4 are read in their packed form from the pool views;
    biases and the activation come from ``layout`` (:class:`kernels.moe_weights.ExpertFormat`). ``config``
    overrides the tuned launch setting (benchmarks and tests use it to pick a variant). Every expert
    in ``topk_ids`` must have a valid slot; neither is checked on the device (that would sync).
    ``x16``: ``x`` as 16-bit planes (:mod:`kernels.act16`, groups of the experts' group size), which
    the int4 and mxfp4 decode kernels then use instead of making them; other formats and variants ignore it
    (:func:`act16_group` says when it is used).
    """
    from kernels.moe_align import moe_align
    from kernels.moe_decode import moe_decode, pdl_supported
    from kernels.moe_prefill import moe_prefill
    from kernels.moe_weights import FMT_INT4, FMT_MXFP4, host_matrices, expert_format, pool_matrix

    _check_inputs(x, topk_ids, topk_weights, slot_of_expert, layout)
    t, k = topk_ids.shape
    if t == 0:
        return torch.empty_like(x)
    w13, w2 = pool_matrix(views, "w13", layout), pool_matrix(views, "w2", layout)
    consts = expert_format(layout)
    cfg = config or moe_launch_config(_device_name(x.device), layout.fmt, t)
    if cfg.variant == "decode" or host is not None:
        return moe_decode(x, topk_ids, topk_weights, slot_of_expert, w13, w2, consts, cfg.up, cfg.down,
                          cfg.pdl and pdl_supported(x.device),
                          None if host is None else host_matrices(host, layout, w13, w2),
                          x16 if consts.fmt in (FMT_INT4, FMT_MXFP4) else None)       # [T, D]
    align = moe_align(topk_ids, slot_of_expert, cfg.block_m)
    y = moe_prefill(x, topk_weights, align, w13, w2, consts, cfg.up, cfg.down, join=cfg.join)
    return y.view(t, k, -1).sum(dim=1).to(x.dtype)                     # [T*k, D] -> [T, D]


def act16_group(layout: ExpertLayout, tokens: int, device: torch.device, direct: bool = False) -> int | None:
    """The group size in which :func:`fused_moe` takes ``x16`` for a call of ``tokens`` tokens on
    ``device`` (``direct``: with experts read from the host store), or None where it would not use it:
    int4 or mxfp4 experts on a GPU, run by the decode variant."""
    if layout.fmt not in ("int4", "mxfp4") or device.type != "cuda" or tokens == 0:
        return None
    if direct or moe_launch_config(_device_name(device), layout.fmt, tokens).variant == "decode":
        return layout.group_size
    return None
