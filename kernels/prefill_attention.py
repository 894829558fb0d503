"""Paged prefill attention: a step's new queries of several sequences over their block-paged KV cache.

Sequence b owns query rows ``q_starts[b] .. q_starts[b] + q_lens[b]`` of the step; its query i sits at
position ``ctx_lens[b] - q_lens[b] + i`` (the cache already holds the step's own keys), so a whole
prompt (q_len == ctx_len) and a later chunk of one (q_len < ctx_len) are the same case. Query i sees
the positions up to its own (causal); in a sliding-window layer of W only the last W of them
(``> position - W``). Key position p of sequence b is cache row
``block_tables[b, p // block_size] * block_size + p % block_size``. GQA: head h reads KV head
``h // (H // Hkv)``. Sinks (gpt-oss): a logit per query head that joins the softmax's denominator and
attends to nothing.

:func:`prefill_attention` is flash attention over the paged cache: one program per (query head, tile
of ``block_m`` queries, sequence) keeps a running (max, sum, acc) in float32 over tiles of
``block_n`` keys read through the block table. It visits only the keys some query of its tile can
see: none past the tile's last position, and with a window none before its first query's window, so
a window layer's cost follows from W rather than from the context. Scores and the probability-value
product run on tensor cores in the cache dtype with float32 accumulation (IEEE fp32 for an fp32
cache). The truth is ``engine.models.layers.paged_attention_ref``.

Legend: T query rows of the step, B sequences, H query heads, Hkv KV heads, G = H // Hkv, hd head dim,
nb block-table width, BM / BN query / key tile sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.paged_attention import LOG2E, check_q_cache, check_sinks_window


@dataclass(frozen=True)
class PrefillAttentionLaunch:
    """Launch settings of :func:`prefill_attention` (tile sizes are powers of two >= 16)."""
    block_m: int = 64              # queries per program
    block_n: int = 64              # keys per loop step
    num_warps: int = 4
    num_stages: int = 2


# Over 60 lines: a Triton program is one function (its helpers are inlined @triton.jit calls),
# and splitting its main loop further would only move loads away from the math they feed.
@jit
def _prefill_attention_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, starts_ptr, qlens_ptr, ctx_ptr,
                              sinks_ptr, out_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_st, stride_btb, stride_ot, stride_oh, qk_scale, window,
                              G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                              WINDOWED: tl.constexpr, SINKS: tl.constexpr, QUANT: tl.constexpr,
                              DOT_PREC: tl.constexpr):
    h = tl.program_id(0)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)                      # causal: the longest tiles first
    b = tl.program_id(2)
    q_len = tl.load(qlens_ptr + b)
    if tile * BLOCK_M >= q_len:  # the grid covers the longest sequence of the step
        return
    ctx = tl.load(ctx_ptr + b)
    kvh = h // G
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)                      # [BM] query index in the sequence
    offs_n = tl.arange(0, BLOCK_N)                                       # [BN]
    offs_d = tl.arange(0, BLOCK_D)                                       # [BD]
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    qpos = ctx - q_len + tl.minimum(offs_m, q_len - 1)                   # [BM] positions; padding rows
                                                                         # repeat the last query (unstored)
    q_rows = (tl.load(starts_ptr + b) + offs_m).to(tl.int64)             # [BM] rows of q and out
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)           # [BM, BD]
    hi = tl.minimum(ctx - q_len + (tile + 1) * BLOCK_M, ctx)             # past the tile's last query: unseen
    if WINDOWED:
        lo = tl.maximum(ctx - q_len + tile * BLOCK_M - window + 1, 0)    # before its first query's window
    else:
        lo = 0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)                 # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)                                # running sum of exp2
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)                       # running sum of p * v
    bt_row = bt_ptr + b * stride_btb
    for t0 in range(lo, hi, BLOCK_N):
        kpos = t0 + offs_n                                               # [BN] key positions
        k_ok = kpos < hi
        blk = tl.load(bt_row + kpos // BLOCK_SIZE, mask=k_ok, other=0)   # [BN] unused entries unread
        row = blk.to(tl.int64) * BLOCK_SIZE + kpos % BLOCK_SIZE          # [BN] cache rows
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + row[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :], mask=kv_mask,
                    other=0.0)                                           # [BN, BD]
        if QUANT:  # int8 / fp8 rows dequantised as the cache's gather does: stored * scale, in q's dtype
            k_sc = tl.load(ks_ptr + row * stride_st + kvh, mask=k_ok, other=0.0)          # [BN]
            k = (k.to(tl.float32) * k_sc[:, None]).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BM, BN]
        see = (kpos[None, :] <= qpos[:, None]) & k_ok[None, :]           # [BM, BN] causal
        if WINDOWED:
            see = see & (kpos[None, :] > qpos[:, None] - window)
        qk = tl.where(see, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))                      # -inf: row saw nothing yet
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)             # keeps exp2 of -inf - -inf out
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(qk - m_use[:, None])                                 # [BM, BN]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + row[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :], mask=kv_mask,
                    other=0.0)                                           # [BN, BD]
        if QUANT:
            v_sc = tl.load(vs_ptr + row * stride_st + kvh, mask=k_ok, other=0.0)          # [BN]
            v = (v.to(tl.float32) * v_sc[:, None]).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
    if SINKS:  # the sink's exp joins the denominator (inf for a huge sink: the output goes to 0)
        o = acc / (l_i + tl.exp2(tl.load(sinks_ptr + h) * 1.4426950408889634 - m_i))[:, None]
    else:
        o = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, block_size: int,
                      max_q_len: int, max_ctx_len: int, sinks: torch.Tensor | None = None, window: int = 0,
                      scale: float | None = None, *, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None,
                      launch: PrefillAttentionLaunch | None = None) -> torch.Tensor:
    """Causal paged attention of a step's queries -> [T, H, hd] in q.dtype (float32 softmax).

    q [T, H, hd] bf16/fp16/fp32; k_cache / v_cache [num_blocks * block_size, Hkv, hd] in q's dtype (or
    int8 / fp8 e4m3 with ``k_scale`` / ``v_scale`` [num_blocks * block_size, Hkv] float32, value = stored
    * scale, dequantised to q's dtype as loaded), already holding the step's keys; block_tables [B, nb] int32; q_starts, q_lens, ctx_lens [B] int32
    (1 <= q_len <= ctx_len <= nb * block_size). ``max_q_len`` bounds q_lens (it sizes the grid) and
    ``max_ctx_len`` bounds ctx_lens; neither is checked against the device tensors (that would sync).
    ``sinks`` [H] float32: a sink logit per query head; ``window`` > 0: a query at position p sees
    positions p - window + 1 .. p only. ``scale`` defaults to 1 / sqrt(hd). Rows of q that belong to no
    sequence are left unwritten in the output. The last dim of q and of the caches must be contiguous.
    """
    check_q_cache(q, k_cache, v_cache, block_size, k_scale, v_scale, "[T, H, hd]")
    b = _check(q, k_cache, v_cache, block_tables, (q_starts, q_lens, ctx_lens), block_size, max_q_len,
               max_ctx_len)
    check_sinks_window(sinks, window, q.shape[1], q.device)
    launch = launch or PrefillAttentionLaunch()
    for name, size in (("block_m", launch.block_m), ("block_n", launch.block_n)):
        if size < 16 or size & (size - 1):
            raise ValueError(f"launch.{name}={size} must be a power of two >= 16")
    t, h, hd = q.shape
    out = torch.empty_like(q)                                            # [T, H, hd]
    if t == 0 or b == 0:
        return out
    window = window if window < max_ctx_len else 0                       # a window past every context cuts nothing
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    quant = k_scale is not None
    grid = (h, cdiv(max_q_len, launch.block_m), b)
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, k_scale if quant else q, v_scale if quant else q, block_tables, q_starts, q_lens,
        ctx_lens, q if sinks is None else sinks, out, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), k_scale.stride(0) if quant else 0,
        block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E, window,
        G=h // k_cache.shape[1], HEAD_DIM=hd, BLOCK_SIZE=block_size, BLOCK_M=launch.block_m,
        BLOCK_N=launch.block_n, BLOCK_D=max(16, next_pow2(hd)), WINDOWED=window > 0, SINKS=sinks is not None,
        QUANT=quant, DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=launch.num_warps,
        num_stages=launch.num_stages)
    return out


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           seq_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor], block_size: int, max_q_len: int,
           max_ctx_len: int) -> int:
    """One-sentence errors for the step's sequence arguments (checked without a sync) -> B."""
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32 [B, max_blocks], got {block_tables.dtype} "
                         f"{tuple(block_tables.shape)}")
    b = block_tables.shape[0]
    for name, t in zip(("q_starts", "q_lens", "ctx_lens"), seq_tensors):
        if t.shape != (b,) or t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32 [{b}] (one per block-table row), got {t.dtype} "
                             f"{tuple(t.shape)}")
    if not 1 <= max_q_len <= max(max_ctx_len, 1) or max_ctx_len > block_tables.shape[1] * block_size:
        raise ValueError(f"need 1 <= max_q_len ({max_q_len}) <= max_ctx_len ({max_ctx_len}) <= block-table "
                         f"width * block_size ({block_tables.shape[1] * block_size})")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                    *zip(("q_starts", "q_lens", "ctx_lens"), seq_tensors)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move both to one device")
    return b
