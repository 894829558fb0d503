"""Expert prediction in one launch: later layers' routers applied to a decode step's hidden state, top-k.

The prefetcher guesses the experts of layer ``first + p`` by applying that layer's router (its norm
weight folded in) to the current hidden state ``h [T, D]``. Softmax is monotonic, so the guess is the
top-k of the raw logits. A router with a bias ``b`` (gpt-oss) routes ``W norm(h) + b``; with the norm
weight folded into ``W`` that is ``(W h) / rms(h) + b``, whose top-k is that of ``W h + rms(h) b``, so
the bias enters scaled by each token's RMS (``bias``, ``eps``). Sigmoid scores with a choice bias ``c``
(GLM) choose by ``sigmoid((W h) / rms(h)) + c`` (``score_bias``).

As a GEMM plus the routing kernel this is two launches per layer on the
decode critical path, each a few microseconds at T <= 16; here it is one:

* grid ``(P, E / BLOCK_E)``: each program computes ``BLOCK_E`` logits of every token for one
  predicted layer (a [16, D] x [D, BLOCK_E] dot over D in chunks) and stores them in a float32
  workspace;
* the program that completes a layer (an acq_rel counter per layer, reset by that program) reads the
  layer's ``[T, E]`` logits back and picks each token's top-k (ties: the lower id, as the router).

Legend: T tokens (at most ``MAX_TOKENS``), D hidden, E experts, P predicted layers, k experts per token.
"""
from __future__ import annotations

import torch

from kernels._triton import HAS_TRITON, jit, next_pow2, tl

MAX_TOKENS = 16          # rows of one dot tile: the decode steps that predict experts
BLOCK_E = 16             # experts per program
BLOCK_D = 128


@jit
def _predict_kernel(h_ptr, w_ptr, b_ptr, c_ptr, logits_ptr, count_ptr, ids_ptr, T, D, E, stride_h, first, eps,
                    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_EALL: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, BIAS: tl.constexpr,
                    SCORED: tl.constexpr):
    p = tl.program_id(0)
    eb = tl.program_id(1)
    t = tl.arange(0, BLOCK_T)
    t_ok = t < T
    e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < E
    w_base = w_ptr + (first + p).to(tl.int64) * E * D
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)                           # sum of squares of h, for the biases
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d_ok = d < D
        x = tl.load(h_ptr + t[:, None] * stride_h + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        if BIAS or SCORED:
            xf = x.to(tl.float32)
            sq += tl.sum(xf * xf, axis=1)
        w = tl.load(w_base + e[None, :] * D + d[:, None], mask=e_ok[None, :] & d_ok[:, None], other=0.0)
        if UPCAST:                      # float32 routers, or the interpreter: float32 products
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(x.to(w.dtype), w, acc)                              # [BT, BE]
    if BIAS:
        b = tl.load(b_ptr + (first + p).to(tl.int64) * E + e, mask=e_ok, other=0.0)   # [BE] float32
        acc += tl.sqrt(sq / D + eps)[:, None] * b[None, :]
    if SCORED:
        c = tl.load(c_ptr + (first + p).to(tl.int64) * E + e, mask=e_ok, other=0.0)   # [BE] float32
        acc = 1.0 / (1.0 + tl.exp(-acc / tl.sqrt(sq / D + eps)[:, None])) + c[None, :]
    ws = logits_ptr + p * BLOCK_T * BLOCK_EALL
    tl.store(ws + t[:, None] * BLOCK_EALL + e[None, :], acc, mask=t_ok[:, None] & e_ok[None, :])
    tl.debug_barrier()                  # every thread's logits, then the program's count
    if tl.atomic_add(count_ptr + p, 1, sem="acq_rel") == tl.num_programs(1) - 1:
        cols = tl.arange(0, BLOCK_EALL)
        kcols = tl.arange(0, BLOCK_K)
        ok = t_ok[:, None] & (cols[None, :] < E)
        s = tl.load(ws + t[:, None] * BLOCK_EALL + cols[None, :], mask=ok, other=-float("inf"),
                    cache_modifier=".cg")                                    # [BT, BEALL], other programs' stores
        ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int64)
        for j in tl.static_range(TOP_K):
            best = tl.max(s, axis=1)
            idx = tl.min(tl.where(s == best[:, None], cols[None, :], BLOCK_EALL), axis=1)   # lowest id wins
            ids = tl.where(kcols[None, :] == j, idx[:, None].to(tl.int64), ids)
            s = tl.where(cols[None, :] == idx[:, None], -float("inf"), s)
        tl.store(ids_ptr + p * T * TOP_K + t[:, None] * TOP_K + kcols[None, :], ids,
                 mask=t_ok[:, None] & (kcols[None, :] < TOP_K))
        tl.atomic_xchg(count_ptr + p, 0)                                     # ready for the next launch


class PredictWorkspace:
    """The kernel's float32 logits and per-layer counters for up to ``max_layers`` predicted layers
    (allocated once, outside any CUDA-graph capture; the counters return to zero after each launch)."""

    def __init__(self, max_layers: int, num_experts: int, device: torch.device) -> None:
        self.max_layers, self.e_pad = max_layers, next_pow2(num_experts)
        self.logits = torch.empty(max_layers * MAX_TOKENS * self.e_pad, dtype=torch.float32, device=device)
        self.counts = torch.zeros(max_layers, dtype=torch.int32, device=device)


def predict_topk(hidden: torch.Tensor, routers: torch.Tensor, first: int, count: int, top_k: int,
                 ws: PredictWorkspace, bias: torch.Tensor | None = None, eps: float = 1e-6,
                 score_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Ids ``int64 [P, T, k]`` of the top-k logits of ``routers[first:first+P] [P, E, D]`` applied to
    ``hidden [T, D]`` (``T <= MAX_TOKENS``, ``P <= ws.max_layers``); one launch. ``bias`` float32
    ``[L, E]``: the routers' biases, added scaled by each token's RMS (``eps`` as in its norm).
    ``score_bias`` float32 ``[L, E]``: choose by ``sigmoid(logits / rms) + score_bias`` instead."""
    T, D = hidden.shape
    E = routers.shape[1]
    if T > MAX_TOKENS or count > ws.max_layers or not routers.is_contiguous():
        raise ValueError(f"predict_topk takes at most {MAX_TOKENS} tokens and {ws.max_layers} layers of "
                         f"contiguous routers; got {T} tokens, {count} layers")
    h = hidden.to(routers.dtype)
    if h.stride(1) != 1:
        h = h.contiguous()
    ids = torch.empty(count, T, top_k, dtype=torch.int64, device=hidden.device)
    upcast = not hidden.is_cuda or routers.dtype == torch.float32
    _predict_kernel[(count, -(-E // BLOCK_E))](
        h, routers, routers if bias is None else bias, routers if score_bias is None else score_bias, ws.logits,
        ws.counts, ids, T, D, E, h.stride(0), first, eps, TOP_K=top_k, BLOCK_T=MAX_TOKENS, BLOCK_E=BLOCK_E,
        BLOCK_D=BLOCK_D, BLOCK_EALL=ws.e_pad, BLOCK_K=next_pow2(top_k), UPCAST=upcast, BIAS=bias is not None,
        SCORED=score_bias is not None, num_warps=4)
    return ids


def predict_topk_ref(hidden: torch.Tensor, routers: torch.Tensor, first: int, count: int, top_k: int,
                     bias: torch.Tensor | None = None, eps: float = 1e-6,
                     score_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: the same ids (float32 logits; ties to the lower id)."""
    w = routers[first:first + count].float()                                # [P, E, D]
    logits = torch.einsum("td,ped->pte", hidden.float(), w)                 # [P, T, E]
    if bias is not None:
        logits = logits + rms(hidden, eps)[None, :, None] * bias[first:first + count, None, :].float()
    if score_bias is not None:
        logits = torch.sigmoid(logits / rms(hidden, eps)[None, :, None]) + score_bias[first:first + count, None, :]
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    return order[..., :top_k].to(torch.int64)


def rms(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``[T]`` float32: each row's root mean square (as RMSNorm divides by it)."""
    return torch.sqrt(hidden.float().pow(2).mean(-1) + eps)


def available(device: torch.device) -> bool:
    return device.type == "cuda" and HAS_TRITON
