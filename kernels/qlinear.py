"""Linear layers over 8-bit resident weights: ``y = (x @ q.T) * scale + bias``, dequantised in the K loop.

The resident matrices (attention, dense and shared-expert MLPs, the LM head) can live on the GPU as
fp8 (e4m3) or int8 with one float32 scale per output row (:class:`QuantWeight`), which halves the
bytes each decoded token reads from them. The kernel loads a ``[BLOCK_N, BLOCK_K]`` tile of 8-bit
weights, widens it to the activations' dtype in registers and feeds the tensor cores; the row scale
and the bias are applied once, to the fp32 accumulator. No widened copy of a matrix is ever written.

Decode steps (a few tokens) are bound by the weight bytes: the launcher then takes narrow ``BLOCK_N``
tiles so that the grid covers every SM several times over, and pads the tokens to the 16 rows the
tensor cores take. Prefill steps use square-ish tiles.

Legend: T tokens, K reduction dim (in features), N output rows (out features).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._triton import HAS_TRITON, cdiv, jit, tl

RESIDENT_QUANT = ("fp8", "int8")
INT8_MAX = 127.0
_FP8_MAX = 448.0
_QUANT_CHUNK_ROWS = 8192       # rows quantised at a time: bounds the float32 temporary of a huge LM head


@dataclass(frozen=True)
class QuantWeight:
    """An ``[N, K]`` matrix stored in 8 bits: ``w[n, k] = q[n, k] * scale[n]``."""

    q: torch.Tensor                  # [N, K] float8_e4m3fn or int8
    scale: torch.Tensor              # [N] float32
    fmt: str                         # "fp8" | "int8"

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[N, K]`` in ``dtype`` (for references and tests; the kernels never build it)."""
        return (self.q.to(torch.float32) * self.scale[:, None]).to(dtype)


def quantize_rows(w: torch.Tensor, fmt: str) -> QuantWeight:
    """``w [N, K]`` (any float dtype, any device) -> :class:`QuantWeight`, symmetric per output row.

    Each row's largest magnitude maps to the format's largest value (448 for e4m3, 127 for int8);
    an all-zero row gets scale 1. Rows are quantised in chunks so the float32 temporary stays small.
    """
    if fmt not in RESIDENT_QUANT:
        raise ValueError(f"resident weight format {fmt!r} is not one of {RESIDENT_QUANT}")
    if w.dim() != 2:
        raise ValueError(f"quantize_rows expects a matrix [N, K], got shape {tuple(w.shape)}")
    top = _FP8_MAX if fmt == "fp8" else INT8_MAX
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn if fmt == "fp8" else torch.int8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for r in range(0, w.shape[0], _QUANT_CHUNK_ROWS):
        wf = w[r:r + _QUANT_CHUNK_ROWS].float()                       # [n, K]
        amax = wf.abs().amax(dim=1)                                    # [n]
        s = torch.where(amax > 0, amax / top, torch.ones_like(amax))
        v = (wf / s[:, None]).clamp_(-top, top)
        q[r:r + _QUANT_CHUNK_ROWS] = v if fmt == "fp8" else v.round_()
        scale[r:r + _QUANT_CHUNK_ROWS] = s
    return QuantWeight(q, scale, fmt)


@jit
def _qlinear_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, T, N, K, stride_xt, stride_qn, stride_yt,
                    HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    pid_n, pid_t = tl.program_id(0), tl.program_id(1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)                     # [BT] tokens
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                     # [BN] output rows
    ks = tl.arange(0, BLOCK_K)                                         # [BK]
    t_ok, n_ok = rows < T, cols < N
    x_ptrs = x_ptr + rows[:, None] * stride_xt + ks[None, :]           # [BT, BK]
    q_ptrs = q_ptr + cols[:, None] * stride_qn + ks[None, :]           # [BN, BK]
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=t_ok[:, None], other=0.0)
            w = tl.load(q_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k + ks) < K
            x = tl.load(x_ptrs, mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(q_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        # widen in registers (through fp32: exact for e4m3 and int8, and what the interpreter handles)
        acc = tl.dot(x, tl.trans(w.to(tl.float32).to(x.dtype)), acc)
        x_ptrs += BLOCK_K
        q_ptrs += BLOCK_K
    acc = acc * tl.load(s_ptr + cols, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows[:, None] * stride_yt + cols[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=t_ok[:, None] & n_ok[None, :])


@jit
def _qgemv_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, N, K, stride_qn,
                  HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                  SCALED: tl.constexpr = True):
    """One token: no tensor cores (15 of 16 rows would be padding); partial sums stay per lane until
    the end, so the loop is loads and fused multiply-adds only. ``SCALED`` False: 16-bit weights, no
    row scale (:func:`gemv16`)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)          # [BN]
    ks = tl.arange(0, BLOCK_K)                                         # [BK]
    n_ok = cols < N
    q_ptrs = q_ptr + cols[:, None] * stride_qn + ks[None, :]           # [BN, BK]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptr + k + ks).to(tl.float32)
            w = tl.load(q_ptrs, mask=n_ok[:, None], other=0.0).to(tl.float32)
        else:
            k_ok = (k + ks) < K
            x = tl.load(x_ptr + k + ks, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(q_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
        q_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)                                            # [BN]
    if SCALED:
        y = y * tl.load(s_ptr + cols, mask=n_ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=n_ok)


LM_HEAD_ROWS = 32768        # from this many rows a one-token matrix takes the LM head's tiles (_gemv_tiles)


def _gemv_tiles(N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) of the one-token kernel. Attention-sized matrices (a few thousand
    rows) take 8 rows a program with long K runs and 8 warps: few programs must keep enough bytes in
    flight. LM heads (hundreds of thousands of rows) have programs enough at 16 x 256 and 4 warps.
    From ``bench_qlinear.py --gemv-sweep`` on the H100 (fp8, HBM-resident copies): Qwen3-30B-A3B's
    qkv 8.4 -> 6.1 us, its o 14.1 -> 6.4 us, gpt-oss's qkv 12.2 -> 8.4 us; its LM head's best was 16 x 256."""
    most = max(16, 1 << (K - 1).bit_length())
    if N >= LM_HEAD_ROWS:
        return 16, min(256, most), 4
    return 8, min(1024 if K >= 4096 else 512, most), 8


def _tiles(T: int, N: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_N, BLOCK_K, num_warps). Decode: 16 token rows and the widest ``BLOCK_N`` that
    still gives every SM at least two programs (the step is bound by the weight bytes). Prefill:
    64 x 128 tiles (bound by the math)."""
    if T > 32:
        return 64, 128, 64, 4
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    block_n = 64
    while block_n > 16 and cdiv(N, block_n) < 2 * sms:
        block_n //= 2
    return (16 if T <= 16 else 32), block_n, 256, 4


def qlinear(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [T, K]`` (bf16 / fp16 / fp32) times ``w`` ``[N, K]`` (8-bit, row scales) -> ``[T, N]`` in
    ``x.dtype``, plus ``bias [N]`` when given. One launch; graph-capturable (no sync, no allocation
    but the output). One token takes the GEMV kernel, more the tensor-core tiles. Measured on the H200
    (benchmarks/kernels/bench_qlinear.py) against cuBLAS bf16 over the same matrix: LM heads 1.6-1.8x
    faster at 1 and 8 tokens, attention matrices 0.9-1.1x at one token and 0.6-0.9x at 8; widening row
    chunks for cuBLAS instead was slower still at 64 tokens (0.06-0.1x)."""
    if x.dim() != 2 or x.shape[1] != w.q.shape[1]:
        raise ValueError(f"qlinear: x {tuple(x.shape)} does not match the weight {tuple(w.q.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    T, K = x.shape
    N = w.q.shape[0]
    y = torch.empty(T, N, dtype=x.dtype, device=x.device)
    if T == 0:
        return y
    if T == 1:
        bn, bk, warps = _gemv_tiles(N, K)
        _qgemv_kernel[(cdiv(N, bn),)](x, w.q, w.scale, bias if bias is not None else w.scale, y, N, K, w.q.stride(0),
                                      HAS_BIAS=bias is not None, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0,
                                      num_warps=warps, num_stages=4)
        return y
    bt, bn, bk, warps = _tiles(T, N, x.device)
    bk = min(bk, max(16, 1 << (K - 1).bit_length()))
    grid = (cdiv(N, bn), cdiv(T, bt))
    _qlinear_kernel[grid](x, w.q, w.scale, bias if bias is not None else w.scale, y, T, N, K,
                          x.stride(0), w.q.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_T=bt,
                          BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0, num_warps=warps, num_stages=4)
    return y


# Whether one-token steps take gemv16 for 16-bit resident matrices and routers (CUDA), rather than
# cuBLAS: off until the GPU tests have run with it on (h200_session.sh gemv-on). The Qwen3-30B-A3B shape's
# bf16 step (12 layers, H100) 1368 -> 1348 us with it, 147 -> 135 kernels (its o projection was a split-K
# GEMM and a reduce, the router a 5 us GEMV; step_profile_2026-12-06d.json).
GEMV16 = False


def gemv16_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`gemv16` takes ``x @ w.T``: one token, 16-bit ``w`` of ``x``'s dtype, on CUDA."""
    return (GEMV16 and HAS_TRITON and x.dim() == 2 and x.shape[0] == 1 and x.is_cuda
            and w.dtype in (torch.bfloat16, torch.float16) and x.dtype == w.dtype and w.stride(1) == 1)


def gemv16(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [1, K] @ w [N, K].T (+ bias)`` -> ``[1, N]`` in ``x.dtype``, for 16-bit (or float32) ``w``:
    the one-token kernel of :func:`qlinear` without a row scale (float32 accumulation)."""
    if x.dim() != 2 or x.shape[0] != 1 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemv16: x {tuple(x.shape)} must be one row of w's width {tuple(w.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    n, k = w.shape
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    bn, bk, warps = _gemv_tiles(n, k)
    _qgemv_kernel[(cdiv(n, bn),)](x, w, w, bias if bias is not None else w, y, n, k, w.stride(0),
                                  HAS_BIAS=bias is not None, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=k % bk == 0,
                                  SCALED=False, num_warps=warps, num_stages=4)
    return y


def qlinear_ref(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of :func:`qlinear`: float32 math over the dequantised matrix, in row chunks so a
    huge LM head never exists widened whole."""
    xf = x.float()
    out = torch.empty(x.shape[0], w.q.shape[0], dtype=torch.float32, device=x.device)
    for r in range(0, w.q.shape[0], _QUANT_CHUNK_ROWS):
        part = slice(r, r + _QUANT_CHUNK_ROWS)
        out[:, part] = (xf @ w.q[part].to(torch.float32).t()) * w.scale[part]
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor | QuantWeight, bias: torch.Tensor | None = None,
           kernel: bool = False, head: bool = False) -> torch.Tensor:
    """``x @ w.T (+ bias)`` for a plain matrix or a :class:`QuantWeight`; ``kernel``: the Triton kernel
    (CUDA) for the latter, else the reference. ``head``: an LM head, which a 16-bit one-token step leaves to
    cuBLAS (it reads Qwen3-30B-A3B's 622 MB head at the copy ceiling already: 203 us on the H100, 3.06 TB/s,
    benchmarks/results/step_profile_2026-12-06c.json)."""
    if isinstance(w, QuantWeight):
        if kernel and HAS_TRITON:
            return qlinear(x, w, bias)
        return qlinear_ref(x, w, bias)
    if kernel and not head and gemv16_fits(x, w):
        return gemv16(x, w, bias)
    return torch.nn.functional.linear(x, w, bias)        # the bias in the GEMM's epilogue where cuBLAS can
