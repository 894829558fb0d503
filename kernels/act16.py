"""16-bit fixed-point activations for the 4-bit (int4 and MXFP4) decode MoE (kernels/moe_decode_4bit.py).

A vector ``v`` is stored as ``v = sv * q`` with ``q`` an int16 and ``sv = max |v| / 32767`` over a
block (every element at least 1/128 of the block's largest keeps more bits than bf16 has, and none is
off by more than ``max |v| / 65534``). The int4 kernels multiply ``q`` with packed nibbles by ``dp2a``,
so ``q`` is laid out to match the bytes of a packed weight word: ``w & 0x0F0F0F0F`` holds elements
``0, 2, 4, 6`` of the word and ``(w >> 4) & 0x0F0F0F0F`` elements ``1, 3, 5, 7``, so the activations of
a word go into four int32 "planes" that match those bytes pairwise: plane ``p`` holds elements
``(0, 2) / (4, 6) / (1, 3) / (5, 7)`` for ``p = 0 / 1 / 2 / 3``, the first in the low half. A row of
``K`` elements is four planes of ``K / 8`` words.

Two producers:

* :class:`Act16` of ``x`` (the MoE input), one scale per weight group of ``G`` elements with each
  group's sum of ``q`` (the zero points need it): :func:`act16` (a launch of its own, one program per
  group) or the add + RMSNorm that computes ``x`` (:func:`kernels.decode_ops.add_rms_norm_act16`), which
  takes it off the MoE's chain of launches; both call :func:`store_act16_group`;
* ``h`` (the FFN activations), one scale per word of eight, written by the int4 up kernel as it
  produces them (:func:`store_h_words`).

:func:`act16_ref` is the plain-torch version of the first.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels._triton import jit, tl
from kernels.moe_decode_common import gdc_launch_dependents, gdc_wait


class Act16(NamedTuple):
    """Rows ``[R, K]`` as 16-bit planes with one scale per group of ``group`` elements."""
    q: torch.Tensor           # [R, K / 2] int32: four planes of K / 8 words per row
    sums: torch.Tensor        # [R, K / G] int32: each group's sum of q
    scales: torch.Tensor      # [R, K / G] float32: sv of each group
    group: int


def act16_empty(rows: int, k: int, group: int, device: torch.device | str) -> Act16:
    """Uninitialised :class:`Act16` storage for ``rows`` rows of ``k`` elements."""
    check_act16_shape(k, group)
    return Act16(torch.empty(rows, k // 2, dtype=torch.int32, device=device),
                 torch.empty(rows, k // group, dtype=torch.int32, device=device),
                 torch.empty(rows, k // group, dtype=torch.float32, device=device), group)


def check_act16_shape(k: int, group: int) -> None:
    if group < 8 or group & (group - 1) or k % group:
        raise ValueError(f"16-bit activations need a power-of-two group of at least 8 that divides the row; "
                         f"got group {group} for rows of {k}")


def check_act16(a: Act16, rows: int, k: int, device: torch.device) -> None:
    """Raises unless ``a`` holds ``rows`` rows of ``k`` elements on ``device``."""
    want = ((rows, k // 2), (rows, k // a.group), (rows, k // a.group))
    got = tuple(tuple(t.shape) for t in a[:3])
    if got != want or (a.q.dtype, a.sums.dtype, a.scales.dtype) != (torch.int32, torch.int32, torch.float32):
        raise ValueError(f"16-bit activations must be int32 {want[0]}, int32 {want[1]}, float32 {want[2]} for "
                         f"{rows} rows of {k}; got {got}: build them with act16() or add_rms_norm_act16()")
    if any(t.device != device or not t.is_contiguous() for t in a[:3]):
        raise ValueError(f"16-bit activations must be contiguous tensors on {device}")


@jit
def round16(v, amax):
    """``round(v * 32767 / amax)`` as int32 in [-32767, 32767] (a block of zeros stays zero)."""
    q = tl.floor(v * (32767.0 / tl.where(amax > 0, amax, 1.0)) + 0.5)
    return tl.minimum(tl.maximum(q, -32767.0), 32767.0).to(tl.int32)   # rounding may touch 32767.5


@jit
def plane_offset(n, K8):
    """Where element ``n`` of a vector goes in its planes, in int16 units: plane ``2 (s & 1) + (s >> 2)``
    of ``K8`` words, word ``n // 8``, half ``(s >> 1) & 1``, for ``s = n % 8``."""
    s = n % 8
    return 2 * ((2 * (s & 1) + (s >> 2)) * K8 + n // 8) + ((s >> 1) & 1)


@jit
def store_act16_group(v, row, grp, q_ptr, sq_ptr, sv_ptr, K, G: tl.constexpr):
    """Group ``grp`` of row ``row`` of an :class:`Act16`: ``v [G]`` float32; ``q_ptr`` is the int16
    view of the planes. Launched with one warp, nothing here crosses warps (no barrier)."""
    amax = tl.max(tl.abs(v), axis=0)
    q = round16(v, amax)                                                # [G] int32
    tl.store(sq_ptr + row * (K // G) + grp, tl.sum(q, axis=0))
    tl.store(sv_ptr + row * (K // G) + grp, amax / 32767.0)
    n = grp * G + tl.arange(0, G)
    tl.store(q_ptr + row * K + plane_offset(n, K // 8), q.to(tl.int16))


@jit
def store_h_words(v, n0, q_row, sv_row, K, K8, N: tl.constexpr):
    """Elements ``n0 .. n0 + N`` of a vector of ``K`` (``v [N]``; ``n0`` and ``N`` whole words) as
    16-bit planes with one scale per word: ``q`` into the planes at ``q_row`` (an int16 view of rows
    of ``K / 2`` int32 words), the scales at ``sv_row``."""
    amax = tl.max(tl.abs(tl.reshape(v, (N // 8, 8))), axis=1)           # [N / 8]
    q = tl.reshape(round16(tl.reshape(v, (N // 8, 8)), amax[:, None]).to(tl.int16), (N,))
    wi = n0 // 8 + tl.arange(0, N // 8)
    tl.store(sv_row + wi, amax / 32767.0, mask=wi < K8)
    n = n0 + tl.arange(0, N)
    tl.store(q_row + plane_offset(n, K8), q, mask=n < K)


@jit
def _act16_kernel(v_ptr, stride_v, q_ptr, sq_ptr, sv_ptr, K, G: tl.constexpr, PDL: tl.constexpr):
    """Group ``program_id(1)`` of row ``program_id(0)`` of ``v``. ``PDL``: waits for the previous
    kernel, then lets the next one launch."""
    row, grp = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    v = tl.load(v_ptr + row * stride_v + grp * G + tl.arange(0, G)).to(tl.float32)
    store_act16_group(v, row, grp, q_ptr, sq_ptr, sv_ptr, K, G)


def act16(v: torch.Tensor, group: int, pdl: bool = False) -> Act16:
    """The rows of ``v [R, K]`` (contiguous last dim) as 16-bit planes with one scale per ``group``
    elements; ``pdl`` launches as a programmatic dependent (Hopper and later). Without contraction,
    like the add + RMSNorm that also writes them, so both round alike."""
    r, k = v.shape
    if v.stride(1) != 1:
        raise ValueError("act16 needs rows with a contiguous last dim (stride(-1) == 1)")
    out = act16_empty(r, k, group, v.device)
    launch = {"launch_pdl": True} if pdl else {}    # only Triton versions with PDL know the option
    if r:
        _act16_kernel[(r, k // group)](v, v.stride(0), out.q.view(torch.int16), out.sums, out.scales, k, G=group, PDL=pdl,
                                       num_warps=1, enable_fp_fusion=False, **launch)
    return out


def act16_ref(v: torch.Tensor, group: int) -> Act16:
    """Plain-torch :func:`act16`, bit for bit (the same float32 operations in the same order)."""
    r, k = v.shape
    check_act16_shape(k, group)
    vg = v.float().reshape(r, k // group, group)
    amax = vg.abs().amax(-1, keepdim=True)                              # [R, K/G, 1]
    inv = 32767.0 / torch.where(amax > 0, amax, torch.ones_like(amax))
    q = torch.floor(vg * inv + 0.5).clamp(-32767, 32767).to(torch.int32)
    words = q.reshape(r, k // 8, 8)
    planes = torch.stack([words[..., [0, 2]], words[..., [4, 6]], words[..., [1, 3]], words[..., [5, 7]]], 1)
    q16 = planes.to(torch.int16).reshape(r, k).contiguous()              # [R, 4, K/8, 2] as int16
    return Act16(q16.view(torch.int32), q.sum(-1, dtype=torch.int32), (amax / 32767.0).squeeze(-1), group)
