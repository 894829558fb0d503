"""Fused per-layer decode ops: residual add + RMSNorm, and q/k norm + RoPE + KV-cache write.

A decode step is launch-bound: in plain torch one RMSNorm is several elementwise kernels, per-head q/k
norm, RoPE and the cache write a dozen more. Each op here is one launch, reproduces the engine's
arithmetic (``engine/models/layers.py``) rounding for rounding, and allocates only from shapes with no
host sync, so it can be captured in a CUDA graph. Both launch with floating-point contraction off: torch
rounds each product before the add (separate kernels), so a fused multiply-add would differ in fp32.

:func:`add_rms_norm`: ``summed = x + residual`` in x's dtype, then ``rms_norm(summed)``: the mean
square and the scaling in float32, rounded to the input dtype, then times the weight in the input dtype.
:func:`add_rms_norm_act16` also writes the result as the int4 MoE's 16-bit planes (kernels/act16.py).

:func:`qk_norm_rope_write`: the fused qkv projection output ``+ bias`` (in the input dtype) is split
into q, k, v heads; q and k get the per-head RMSNorm (optional), then the rotate-half rotary embedding
``x * cos[pos] + roll(x, hd / 2) * sin[pos]`` with the sign in the sine table, each product
and the sum rounded to the input dtype as torch's elementwise ops round them. Rotated k and raw v go to
the cache rows ``slot_mapping``; the rotated q is returned.

Legend: T tokens, N row width, H query heads, Hkv KV heads, hd head dim, P positions in the rope
tables, R cache rows.
"""
from __future__ import annotations

import torch

from kernels.norm_rope import rms_norm, rotate
from kernels._triton import gdc_launch_dependents, gdc_wait, jit, next_pow2, pdl_launch, pdl_supported, tl
from kernels.act16 import Act16, act16_empty, store_act16_group

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_N = 16384        # whole row in registers: 16 warps x 32 lanes x 32 floats
MAX_HEAD_DIM = 512


@jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, stride_x, stride_r, N, eps,
                         BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # launched while the kernel before runs: wait for what it wrote, let the next launch
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)                                        # [BN]
    ok = cols < N
    dt = out_ptr.dtype.element_ty
    x = _summed(x_ptr, r_ptr, sum_ptr, row, stride_x, stride_r, N, cols, ok, dt, HAS_RESIDUAL, True)
    scale = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    _normed(x, scale, w_ptr, out_ptr, row, N, cols, ok, dt)


@jit
def _add_rms_norm_act16_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, stride_x, stride_r, N, eps, q_ptr, sq_ptr,
                               sv_ptr, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, G: tl.constexpr,
                               PDL: tl.constexpr = False):
    """Group ``program_id(1)`` of row ``program_id(0)``, and that group also as 16-bit planes. Every
    program sums the squares of the whole row, in the same order (so all agree on the scale); each
    writes only its group: one group's work per program, in one warp (no barrier), keeps the launch
    as short as the plain norm."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row, grp = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)                                        # [BN]
    ok = cols < N
    dt = out_ptr.dtype.element_ty
    x = _summed(x_ptr, r_ptr, sum_ptr, row, stride_x, stride_r, N, cols, ok, dt, HAS_RESIDUAL, False)
    scale = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    n = grp * G + tl.arange(0, G)                                       # [G]
    g_ok = n < N                                                        # all true: G divides N
    v = _summed(x_ptr, r_ptr, sum_ptr, row, stride_x, stride_r, N, n, g_ok, dt, HAS_RESIDUAL, True)
    y = _normed(v, scale, w_ptr, out_ptr, row, N, n, g_ok, dt)
    store_act16_group(y.to(tl.float32), row, grp, q_ptr, sq_ptr, sv_ptr, N, G)


@jit
def _summed(x_ptr, r_ptr, sum_ptr, row, stride_x, stride_r, N, cols, ok, dt: tl.constexpr,
            HAS_RESIDUAL: tl.constexpr, STORE: tl.constexpr):
    """``x + residual`` at ``cols`` of the row, rounded to ``dt`` as torch's add rounds it, as float32;
    with ``STORE`` and a residual also written to ``sum_ptr``."""
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        x = (x + r).to(dt)                                              # torch's x + residual
        if STORE:
            tl.store(sum_ptr + row * N + cols, x, mask=ok)
        x = x.to(tl.float32)
    return x


@jit
def _normed(x, scale, w_ptr, out_ptr, row, N, cols, ok, dt: tl.constexpr):
    """``weight * (x * scale)`` at ``cols``, each product rounded to ``dt``; stored and returned."""
    h = (x * scale).to(dt).to(tl.float32)                               # h.to(x.dtype)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = (w * h).to(dt)
    tl.store(out_ptr + row * N + cols, y, mask=ok)
    return y


def _check_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.dtype not in DTYPES:
        raise ValueError(f"x must be bf16/fp16/fp32 [T, N], got {x.dtype} {tuple(x.shape)}")
    n = x.shape[1]
    if weight.shape != (n,) or weight.dtype != x.dtype:
        raise ValueError(f"weight must be {x.dtype} [{n}] like x's rows, got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must be {x.dtype} {tuple(x.shape)} like x, got {residual.dtype} "
                         f"{tuple(residual.shape)}")
    for name, t in (("weight", weight), ("residual", residual)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; move both to one device")


def add_rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                     residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch ``(rms_norm(x + residual), x + residual)``; x, residual [T, N], weight [N], one dtype.

    With ``residual=None`` the second result is ``x`` itself.
    """
    _check_norm(x, weight, residual)
    summed = x if residual is None else x + residual                    # [T, N]
    return rms_norm(summed, weight, eps), summed


def _norm_warps(block_n: int) -> int:
    return 16 if block_n >= 8192 else 8 if block_n >= 2048 else 4


def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton add + RMSNorm, same contract as :func:`add_rms_norm_ref`; one program per row.

    x and residual may have a row stride but need a contiguous last dim; N <= ``MAX_N``. Returns new
    contiguous ``(normed [T, N], summed [T, N])`` in x's dtype (``summed`` is x when residual is None).
    """
    normed, summed, _ = _add_rms_norm(x, weight, eps, residual, None)
    return normed, summed


def add_rms_norm_act16(x: torch.Tensor, weight: torch.Tensor, eps: float, group: int,
                       residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, Act16]:
    """:func:`add_rms_norm`, and ``normed`` also as 16-bit planes in groups of ``group``
    (:mod:`kernels.act16`; equal to ``act16(normed, group)``), written by the same launch: the int4
    decode MoE then needs no launch of its own to make them."""
    normed, summed, planes = _add_rms_norm(x, weight, eps, residual, group)
    return normed, summed, planes


def _add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                  group: int | None) -> tuple[torch.Tensor, torch.Tensor, Act16 | None]:
    _check_norm(x, weight, residual)
    t, n = x.shape
    if n > MAX_N:
        raise ValueError(f"add_rms_norm keeps a row in registers; N={n} exceeds {MAX_N}")
    for name, a in (("x", x), ("residual", residual)):
        if a is not None and a.stride(1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1)")
    if weight.stride(0) != 1:
        weight = weight.contiguous()
    planes = None if group is None else act16_empty(t, n, group, x.device)
    normed = torch.empty(t, n, dtype=x.dtype, device=x.device)          # [T, N]
    summed = x if residual is None else torch.empty_like(normed)       # [T, N]
    if t == 0 or n == 0:
        return normed, summed if residual is None else torch.add(x, residual, out=summed), planes
    block_n = next_pow2(n)
    args = (x, residual if residual is not None else x, weight, normed, summed, x.stride(0),
            residual.stride(0) if residual is not None else 0, n, eps)
    pdl = pdl_supported(x.device)        # the launch overlaps the end of the kernel before it (Hopper+)
    if planes is None:
        _add_rms_norm_kernel[(t,)](*args, BLOCK_N=block_n, HAS_RESIDUAL=residual is not None, PDL=pdl,
                                   num_warps=_norm_warps(block_n), enable_fp_fusion=False, **pdl_launch(pdl))
    else:
        _add_rms_norm_act16_kernel[(t, n // group)](*args, planes.q.view(torch.int16), *planes[1:3], BLOCK_N=block_n,
                                                    HAS_RESIDUAL=residual is not None, G=group, PDL=pdl, num_warps=1,
                                                    enable_fp_fusion=False, **pdl_launch(pdl))
    return normed, summed, planes


@jit
def _load_half(ptr, bias_ptr, offs, ok, HAS_BIAS: tl.constexpr, dt: tl.constexpr):
    """Half a head, biased in the storage dtype as torch's ``qkv + bias``, as float32."""
    x = tl.load(ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x = (x + tl.load(bias_ptr + offs, mask=ok, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
    return x


@jit
def _qk_norm_rope_write_kernel(qkv_ptr, bias_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
                               slot_ptr, q_ptr, kc_ptr, vc_ptr, stride_qkv, stride_cos, stride_sin,
                               stride_kr, stride_kh, stride_vr, stride_vh, eps,
                               H: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_HALF: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                               PDL: tl.constexpr = False):
    if PDL:  # launched while the qkv GEMM runs: wait for it before reading a row or writing the cache
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)                                             # 0..H-1 query, H..H+Hkv-1 key
    is_q = head < H
    half: tl.constexpr = HEAD_DIM // 2
    dt = q_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_HALF)                                     # [BH]
    ok = offs < half
    col = head * HEAD_DIM + offs                                        # first half of this head
    row_ptr = qkv_ptr + t * stride_qkv
    x1 = _load_half(row_ptr, bias_ptr, col, ok, HAS_BIAS, dt)           # [BH]
    x2 = _load_half(row_ptr, bias_ptr, col + half, ok, HAS_BIAS, dt)    # [BH]
    if HAS_NORM:
        scale = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_DIM + eps)
        w_ptr = qn_ptr if is_q else kn_ptr
        w1 = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + half + offs, mask=ok, other=0.0).to(tl.float32)
        x1 = (w1 * (x1 * scale).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        x2 = (w2 * (x2 * scale).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    pos = tl.load(pos_ptr + t)
    c1 = tl.load(cos_ptr + pos * stride_cos + offs, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * stride_cos + half + offs, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * stride_sin + offs, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * stride_sin + half + offs, mask=ok, other=0.0).to(tl.float32)
    # roll(x, hd/2) swaps the halves; every product and the sum rounded as separate torch ops round
    o1 = ((x1 * c1).to(dt).to(tl.float32) + (x2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
    if is_q:
        out = q_ptr + (t * H + head) * HEAD_DIM
        tl.store(out + offs, o1, mask=ok)
        tl.store(out + half + offs, o2, mask=ok)
    else:
        kvh = head - H
        slot = tl.load(slot_ptr + t)
        k_out = kc_ptr + slot * stride_kr + kvh * stride_kh
        tl.store(k_out + offs, o1, mask=ok)
        tl.store(k_out + half + offs, o2, mask=ok)
        vcol = (H + HKV + kvh) * HEAD_DIM + offs                        # this KV head's v
        v_out = vc_ptr + slot * stride_vr + kvh * stride_vh
        tl.store(v_out + offs, _load_half(row_ptr, bias_ptr, vcol, ok, HAS_BIAS, dt).to(dt), mask=ok)
        tl.store(v_out + half + offs, _load_half(row_ptr, bias_ptr, vcol + half, ok, HAS_BIAS, dt).to(dt),
                 mask=ok)


def _check_qkv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int,
               num_kv_heads: int, head_dim: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
               bias: torch.Tensor | None) -> None:
    if qkv.dim() != 2 or qkv.dtype not in DTYPES:
        raise ValueError(f"qkv must be bf16/fp16/fp32 [T, (H + 2Hkv) * hd], got {qkv.dtype} {tuple(qkv.shape)}")
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a positive multiple of KV heads ({num_kv_heads})")
    if head_dim < 2 or head_dim % 2 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} must be even and at most {MAX_HEAD_DIM} for the rotate-half rope")
    t, width = qkv.shape[0], (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.shape[1] != width:
        raise ValueError(f"qkv has {qkv.shape[1]} columns but (H + 2Hkv) * hd = ({num_heads} + 2 * "
                         f"{num_kv_heads}) * {head_dim} = {width}")
    for name, a, shape in (("positions", positions, (t,)), ("slot_mapping", slot_mapping, (t,))):
        if a.shape != shape or a.dtype != torch.int64:
            raise ValueError(f"{name} must be int64 [{t}], got {a.dtype} {tuple(a.shape)}")
    for name, a in (("cos", cos), ("sin", sin)):
        if a.dim() != 2 or a.shape[1] != head_dim or a.dtype != qkv.dtype:
            raise ValueError(f"{name} must be a {qkv.dtype} table [P, {head_dim}], got {a.dtype} {tuple(a.shape)}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 3 or c.shape[1:] != (num_kv_heads, head_dim) or c.dtype != qkv.dtype:
            raise ValueError(f"{name} must be {qkv.dtype} [R, {num_kv_heads}, {head_dim}], got {c.dtype} "
                             f"{tuple(c.shape)}")
    for name, w, shape in (("q_norm", q_norm, (head_dim,)), ("k_norm", k_norm, (head_dim,)),
                           ("bias", bias, (width,))):
        if w is not None and (w.shape != shape or w.dtype != qkv.dtype):
            raise ValueError(f"{name} must be {qkv.dtype} {list(shape)}, got {w.dtype} {tuple(w.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm go together: pass both per-head norm weights or neither")
    for name, a in (("positions", positions), ("cos", cos), ("sin", sin), ("k_cache", k_cache),
                    ("v_cache", v_cache), ("slot_mapping", slot_mapping), ("q_norm", q_norm),
                    ("k_norm", k_norm), ("bias", bias)):
        if a is not None and a.device != qkv.device:
            raise ValueError(f"{name} is on {a.device} but qkv is on {qkv.device}; move both to one device")


def qk_norm_rope_write_ref(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                           q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch bias, per-head q/k RMSNorm, rotary embedding and KV-cache write.

    qkv [T, (H + 2Hkv) * hd] (bf16/fp16/fp32), positions [T] int64 into cos / sin [P, hd] (the rotary
    tables: the sine carries the rotate-half sign), k_cache / v_cache [R, Hkv, hd] written at rows
    slot_mapping [T] int64; q_norm / k_norm [hd] and bias [(H + 2Hkv) * hd] optional; all one dtype.
    Returns the rotated q [T, H, hd].
    """
    _check_qkv(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
               head_dim, q_norm, k_norm, bias)
    t = qkv.shape[0]
    if bias is not None:
        qkv = qkv + bias
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
    q = q.reshape(t, num_heads, head_dim)                               # [T, H, hd]
    k = k.reshape(t, num_kv_heads, head_dim)                            # [T, Hkv, hd]
    v = v.reshape(t, num_kv_heads, head_dim)                            # [T, Hkv, hd]
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    rope = cos[positions][:, None, :], sin[positions][:, None, :]       # [T, 1, hd] each
    q, k = rotate(torch.cat([q, k], 1), *rope).split([num_heads, num_kv_heads], 1)
    k_cache.index_copy_(0, slot_mapping, k)
    v_cache.index_copy_(0, slot_mapping, v)
    return q.contiguous()


def qk_norm_rope_write(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                       num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                       q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """Triton bias + q/k norm + RoPE + cache write, same contract as :func:`qk_norm_rope_write_ref`.

    One program per (token, head) over the H query and Hkv key heads; a key head's program also copies
    its v head. qkv rows may be strided; qkv, the tables and the caches need a contiguous last dim.
    Positions and slots are not checked on the device (that would sync): each must index a row of the
    tables and of the caches. Returns a new contiguous q [T, H, hd].
    """
    _check_qkv(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
               head_dim, q_norm, k_norm, bias)
    for name, a in (("qkv", qkv), ("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        if a.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1)")
    q_norm, k_norm, bias = (w if w is None or w.stride(0) == 1 else w.contiguous() for w in (q_norm, k_norm, bias))
    t = qkv.shape[0]
    q = torch.empty(t, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)   # [T, H, hd]
    if t == 0:
        return q
    half = head_dim // 2
    pdl = pdl_supported(qkv.device)
    _qk_norm_rope_write_kernel[(t, num_heads + num_kv_heads)](
        qkv, bias if bias is not None else qkv, positions, cos, sin,
        q_norm if q_norm is not None else qkv, k_norm if k_norm is not None else qkv,
        slot_mapping, q, k_cache, v_cache, qkv.stride(0), cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), eps,
        H=num_heads, HKV=num_kv_heads, HEAD_DIM=head_dim, BLOCK_HALF=next_pow2(half),
        HAS_BIAS=bias is not None, HAS_NORM=q_norm is not None, PDL=pdl, num_warps=1 if half <= 64 else 2,
        enable_fp_fusion=False, **pdl_launch(pdl))
    return q
