"""Prefill MoE GEMMs: tensor-core tiles over M-blocks of pairs aligned by expert.

:func:`kernels.moe_align.moe_align` sorts the (token, expert) pairs by expert and pads each group to
M rows, so program (b, n) multiplies M pairs' activations by one ``[K, BLOCK_N]`` tile column of the
block's expert, read from its pool slot; fp8, int4 and mxfp4 tiles are dequantised in registers inside
the K loop. Blocks past the used length exit at once, so the grid is sized without a host sync.

* up: ``h[p] = act(x[t] @ gate.T + b_gate, x[t] @ up.T + b_up)`` for the pairs ``p`` of a block
  (``t = p // k``; silu(gate) * up or gpt-oss's clamped SwiGLU; biases where the layout has them);
* down: ``y[p] = weight[p] * (h[p] @ w2.T + b2)`` in float32; the caller sums y over the k pairs.

int4 tiles (by default, ``INT4_JOIN``) take each byte's two nibbles minus the zero point, joined back
into K order as exact small integers, run one dot on whole activation rows and apply the group's scale
to its result; ``BLOCK_K`` divides the group size so one scale per row covers a tile. mxfp4 tiles (and
int4's other setting) split K into even and odd halves (low and high nibbles), dequantise them and run
two dots; mxfp4 reads a scale byte per weight byte's group (groups of 32 are narrower than good tiles).

Legend: P = T*k pairs, M block rows, D hidden, F expert FFN, G int4 group size, HK = BLOCK_K / 2 bytes.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, tl
from kernels.moe_align import MoeAlignment
from kernels.moe_config import TileConfig
from kernels.moe_decode_common import e8m0, expert_act, fp4_pair
from kernels.moe_weights import FMT_INT4, FMT_MXFP4, ExpertFormat, PoolMatrix

# int4 tiles as nibble minus zero point in K order (joined, exact small integers, one dot a tile on whole
# activation rows, the group's scale applied to the dot's result) rather than two dots on the even and odd
# halves of K with the weights dequantised in float32 first. The default for int4: a 512-token prefill of
# the Qwen3-30B-A3B shape took 16.6 ms against 32.7 (H100, step_profile_2026-12-06b.json). A launch
# setting's ``join`` (the tuned tables of kernels/configs; benchmarks/kernels/bench_moe.py sweeps both)
# overrides it; benchmarks/step_profile.py +nojoin turns it off.
INT4_JOIN = True


@jit
def _tile_gemm(a_ptr, a_rows, a_ok, stride_a, w_ptr, s_ptr, z_ptr, cols, cols_ok, K, sw_n, ss_n,
               FMT: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, JOIN: tl.constexpr = False):
    """``[BLOCK_M, BLOCK_N]`` float32 = A rows ``a_rows`` times weight rows ``cols`` transposed."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    a_row = a_ptr + a_rows.to(tl.int64)[:, None] * stride_a             # [BM, 1]
    if FMT == 2 and JOIN:  # int4: nibble - zero point in K order (exact small integers), scale after the dot
        HKJ: tl.constexpr = BLOCK_K // 2
        kj = tl.arange(0, HKJ)
        kc = tl.arange(0, BLOCK_K)
        for k0 in range(0, K // 2, HKJ):                                # k0 counts bytes
            kb = k0 + kj                                                # [HK]
            kk = 2 * k0 + kc                                            # [BK]
            a = tl.load(a_row + kk[None, :], mask=a_ok[:, None] & (kk < K)[None, :], other=0.0)    # [BM, BK]
            b = tl.load(w_ptr + cols[:, None] * sw_n + kb[None, :],
                        mask=cols_ok[:, None] & (kb < K // 2)[None, :], other=0).to(tl.int32)      # [BN, HK]
            grp = (2 * k0) // G                                         # the tile sits in one group
            sc = tl.load(s_ptr + cols * ss_n + grp, mask=cols_ok, other=0.0).to(tl.float32)        # [BN]
            zp = tl.load(z_ptr + cols * ss_n + grp, mask=cols_ok, other=0).to(tl.int32)[:, None]  # [BN, 1]
            q = tl.join(((b & 15) - zp).to(a.dtype), ((b >> 4) - zp).to(a.dtype))   # [BN, HK, 2], in [-15, 15]
            q = tl.trans(tl.reshape(q, (BLOCK_N, BLOCK_K)))             # [BK, BN], k = 2 * byte + nibble
            acc += tl.dot(a, q) * sc[None, :]
    elif FMT >= 2:  # int4 or mxfp4 nibbles: K as its even (low nibble) and odd (high nibble) halves
        HK: tl.constexpr = BLOCK_K // 2
        kh = tl.arange(0, HK)
        for k0 in range(0, K // 2, HK):                                 # k0 counts bytes
            kb = k0 + kh                                                # [HK]
            k_ok = kb < K // 2
            ae = tl.load(a_row + 2 * kb[None, :], mask=a_ok[:, None] & k_ok[None, :], other=0.0)
            ao = tl.load(a_row + 2 * kb[None, :] + 1, mask=a_ok[:, None] & k_ok[None, :], other=0.0)
            wm = k_ok[:, None] & cols_ok[None, :]
            b = tl.load(w_ptr + cols[None, :] * sw_n + kb[:, None], mask=wm, other=0)  # [HK, BN]
            if FMT == 2:  # the tile sits in one group: one scale and zero point per column
                grp = (2 * k0) // G
                sc = tl.load(s_ptr + cols * ss_n + grp, mask=cols_ok, other=0.0).to(tl.float32)  # [BN]
                zp = tl.load(z_ptr + cols * ss_n + grp, mask=cols_ok, other=0).to(tl.float32)
                lo = ((b & 15).to(tl.float32) - zp[None, :]) * sc[None, :]
                hi = ((b >> 4).to(tl.float32) - zp[None, :]) * sc[None, :]
            else:         # mxfp4: a scale byte per column and group of 32 (16 bytes), as a [HK, BN] tile
                sb = tl.load(s_ptr + cols[None, :] * ss_n + kb[:, None] // 16, mask=wm, other=0)
                sc = e8m0(sb) * 16384.0                                 # fp4_pair's 2 ** -14 folded in
                lo, hi = fp4_pair(b)
                lo, hi = lo * sc, hi * sc
            acc = tl.dot(ae, lo.to(ae.dtype), acc)
            acc = tl.dot(ao, hi.to(ae.dtype), acc)
    else:
        kc = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + kc
            k_ok = kk < K
            a = tl.load(a_row + kk[None, :], mask=a_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
            w = tl.load(w_ptr + cols[None, :] * sw_n + kk[:, None], mask=k_ok[:, None] & cols_ok[None, :],
                        other=0.0)                                      # [BK, BN]
            acc = tl.dot(a, w.to(a.dtype), acc)
        if FMT == 1:
            acc = acc * tl.load(s_ptr + cols * ss_n, mask=cols_ok, other=0.0)[None, :]
    return acc


@jit
def _up_prefill_kernel(x_ptr, sorted_ptr, bslot_ptr, npad_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr,
                       ss_s, sz_s, ss_n, bias, P, F, K, stride_x, TOP_K: tl.constexpr, FMT: tl.constexpr,
                       G: tl.constexpr, EPI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, JOIN: tl.constexpr = False):
    """``h`` of block ``program_id(0)``'s pairs, outputs ``program_id(1) * BN ..``; ``bias``: the pool's
    ``(bias, slot stride)``, added where ``EPI[3]``; ``EPI``: see :class:`kernels.moe_weights.ExpertFormat`."""
    blk = tl.program_id(0)
    if blk * BLOCK_M >= tl.load(npad_ptr):
        return
    pairs = tl.load(sorted_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]; P marks padding
    p_ok = pairs < P
    slot = tl.load(bslot_ptr + blk).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)           # [BN] gate rows; up = cols + F
    c_ok = cols < F
    w_base, s_base, z_base = w_ptr + slot * sw_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    gate = _tile_gemm(x_ptr, pairs // TOP_K, p_ok, stride_x, w_base, s_base, z_base, cols, c_ok, K,
                      sw_n, ss_n, FMT, G, BLOCK_M, BLOCK_N, BLOCK_K, JOIN)
    up = _tile_gemm(x_ptr, pairs // TOP_K, p_ok, stride_x, w_base, s_base, z_base, cols + F, c_ok, K,
                    sw_n, ss_n, FMT, G, BLOCK_M, BLOCK_N, BLOCK_K, JOIN)
    if EPI[3]:
        b_ptr, sb_s = bias
        gate += tl.load(b_ptr + slot * sb_s + cols, mask=c_ok, other=0.0)[None, :]
        up += tl.load(b_ptr + slot * sb_s + F + cols, mask=c_ok, other=0.0)[None, :]
    h = expert_act(gate, up, EPI)                                       # [BM, BN]
    tl.store(h_ptr + pairs.to(tl.int64)[:, None] * F + cols[None, :], h.to(h_ptr.dtype.element_ty),
             mask=p_ok[:, None] & c_ok[None, :])


@jit
def _down_prefill_kernel(h_ptr, sorted_ptr, bslot_ptr, npad_ptr, tw_ptr, y_ptr, w_ptr, sw_s, sw_n, s_ptr,
                         z_ptr, ss_s, sz_s, ss_n, bias, P, D, F, FMT: tl.constexpr, G: tl.constexpr,
                         EPI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         JOIN: tl.constexpr = False):
    """``y`` of block ``program_id(0)``'s pairs, rows ``program_id(1) * BN ..`` (arguments as the up kernel's)."""
    blk = tl.program_id(0)
    if blk * BLOCK_M >= tl.load(npad_ptr):
        return
    pairs = tl.load(sorted_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]
    p_ok = pairs < P
    slot = tl.load(bslot_ptr + blk).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)           # [BN] hidden rows of w2
    c_ok = cols < D
    y = _tile_gemm(h_ptr, pairs, p_ok, F, w_ptr + slot * sw_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s,
                   cols, c_ok, F, sw_n, ss_n, FMT, G, BLOCK_M, BLOCK_N, BLOCK_K, JOIN)
    if EPI[3]:
        b_ptr, sb_s = bias
        y += tl.load(b_ptr + slot * sb_s + cols, mask=c_ok, other=0.0)[None, :]
    y = y * tl.load(tw_ptr + pairs, mask=p_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + pairs.to(tl.int64)[:, None] * D + cols[None, :], y, mask=p_ok[:, None] & c_ok[None, :])


def _block_k(tile: TileConfig, fmt: int, group: int) -> int:
    # An int4 tile must sit inside one group (one scale per row); int4 and mxfp4 tiles must give dots
    # of >= 16 along each half of K.
    if fmt == FMT_INT4:
        return max(32, min(tile.block_k, group))
    return max(32 if fmt == FMT_MXFP4 else 16, tile.block_k)


def moe_prefill(x: torch.Tensor, topk_weights: torch.Tensor, align: MoeAlignment, w13: PoolMatrix,
                w2: PoolMatrix, consts: ExpertFormat, up: TileConfig, down: TileConfig,
                join: bool | None = None) -> torch.Tensor:
    """``y [T*k, D]`` float32: each pair's routed, weighted expert output (sum over k is the caller's).
    ``join``: int4 tiles of joined nibbles (the launch setting's choice; None: ``INT4_JOIN``)."""
    fmt, group = consts.fmt, consts.group
    join = fmt == FMT_INT4 and (INT4_JOIN if join is None else join)
    t, d = x.shape
    k = topk_weights.shape[1]
    p, f, m, nb = t * k, w13.n // 2, align.block_m, align.max_blocks
    h = torch.empty(p, f, dtype=x.dtype, device=x.device)              # [P, F]
    y = torch.empty(p, d, dtype=torch.float32, device=x.device)        # [P, D]
    w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n = w13.args()
    _up_prefill_kernel[(nb, cdiv(f, up.block_n))](
        x, align.sorted_pairs, align.block_slot, align.num_padded, h, w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n,
        w13.bias_args(), p, f, d, x.stride(0), TOP_K=k, FMT=fmt, G=group, EPI=consts.epi, BLOCK_M=m, BLOCK_N=up.block_n,
        BLOCK_K=_block_k(up, fmt, group), JOIN=join, num_warps=up.num_warps,
        num_stages=up.num_stages)
    w, sw_s, sw_n, s, z, ss_s, sz_s, ss_n = w2.args()
    _down_prefill_kernel[(nb, cdiv(d, down.block_n))](
        h, align.sorted_pairs, align.block_slot, align.num_padded, topk_weights.contiguous(), y, w,
        sw_s, sw_n, s, z, ss_s, sz_s, ss_n, w2.bias_args(), p, d, f, FMT=fmt, G=group, EPI=consts.epi, BLOCK_M=m,
        BLOCK_N=down.block_n,
        BLOCK_K=_block_k(down, fmt, group), JOIN=join, num_warps=down.num_warps,
        num_stages=down.num_stages)
    return y
