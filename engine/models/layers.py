"""Building blocks of the reference forward: RMSNorm, RoPE (plain and YaRN), paged attention, MLP.

Legend: T tokens in the step, H query heads, Hkv KV heads, hd head dim, D hidden, C context length.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.checkpoint.spec import RopeScaling
from kernels.norm_rope import rms_norm, rotate
from kernels.qlinear import QuantWeight, linear

__all__ = ["Rope", "SeqSlice", "mlp", "paged_attention_ref", "rms_norm"]


def _wavelengths(head_dim: int, theta: float) -> torch.Tensor:
    """theta^(2j/hd) ``[hd/2]`` float32 (a dimension pair's wavelength over 2 pi)."""
    return theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE's inverse frequencies ``[hd/2]`` float32: theta^(-2j/hd)."""
    return 1.0 / _wavelengths(head_dim, theta)


def yarn_inv_freq(head_dim: int, theta: float, y: RopeScaling) -> torch.Tensor:
    """YaRN's inverse frequencies ``[hd/2]`` float32: the original frequencies for dimensions that turn
    more than ``beta_fast`` times over the original context, those divided by ``factor`` for dimensions
    that turn fewer than ``beta_slow`` times, and a linear blend between."""
    def dim_of(turns: float) -> float:           # the dimension whose wavelength fits ``turns`` times
        return head_dim * math.log(y.original_max_position / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(y.beta_fast), dim_of(y.beta_slow)
    if y.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001                            # a ramp of width zero would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)   # [hd/2]
    keep = 1 - ramp                              # 1: extrapolate (original frequency), 0: interpolate
    wave = _wavelengths(head_dim, theta)
    return 1.0 / (y.factor * wave) * (1 - keep) + 1.0 / wave * keep


ROPE_CHUNK = 1 << 16       # positions whose float32 angles the tables are built from at a time


class Rope:
    """Rotary embedding tables (rotate-half convention), computed once; YaRN when ``scaling`` says so
    (its attention factor scales both tables). ``rotary_dim`` < ``head_dim`` (GLM's partial RoPE):
    the first ``rotary_dim`` dimensions turn and the rest pass through, with q and k kept in the order
    of :func:`engine.checkpoint.loader.partial_rope_order`, so the passed dimensions sit after the
    turned ones in each half and get cos 1 and sin 0."""

    def __init__(self, head_dim: int, theta: float, max_position: int, device: torch.device,
                 dtype: torch.dtype, scaling: RopeScaling | None = None, rotary_dim: int = 0) -> None:
        dim = rotary_dim or head_dim
        if scaling is None:
            inv_freq, mscale = default_inv_freq(dim, theta), 1.0
        else:
            inv_freq, mscale = yarn_inv_freq(dim, theta, scaling), scaling.mscale
        inv_freq, passed = inv_freq.to(device), (head_dim - dim) // 2
        self.cos = torch.empty(max_position, head_dim, device=device, dtype=dtype)          # [P, hd]
        self.sin = torch.empty(max_position, head_dim, device=device, dtype=dtype)
        for start in range(0, max_position, ROPE_CHUNK):        # float32 work bounded by one chunk's rows
            pos = torch.arange(start, min(start + ROPE_CHUNK, max_position), device=device, dtype=torch.float32)
            freqs = torch.outer(pos, inv_freq)                                       # [p, dim/2]
            ones = torch.ones(len(pos), passed, device=device)                       # [p, (hd - dim)/2]
            half_cos = torch.cat([freqs.cos() * mscale, ones], -1)                   # [p, hd/2]
            half_sin = torch.cat([freqs.sin() * mscale, ones - 1], -1)
            rows = slice(start, start + len(pos))
            self.cos[rows] = torch.cat([half_cos, half_cos], -1)
            # rotate-half is cat(-x2, x1) * sin = roll(x, hd/2) * cat(-sin1, sin2): the sign lives in the table
            self.sin[rows] = torch.cat([-half_sin, half_sin], -1)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, hd] for ``positions`` [T] (gathered once per forward, used by every layer)."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    apply = staticmethod(rotate)     # x [T, heads, hd] rotated by the gathered tables


Gather = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class SeqSlice:
    """One sequence's share of a step: its new tokens are rows q_start..q_start+q_len of the batch."""

    q_start: int
    q_len: int
    ctx_len: int                 # tokens in the cache for this sequence after this step
    block_table: torch.Tensor    # [n_blocks] int64 (on the device)


def paged_attention_ref(q: torch.Tensor, gather: Gather, seqs: list[SeqSlice], block_size: int,
                        sinks: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its cached context.

    q [T, H, hd]; ``gather(rows [C])`` returns the cached K and V ``[C, Hkv, hd]`` in the compute dtype
    (the cache already holds the new keys). Returns [T, H * hd]. ``sinks`` [H]: a sink logit per head
    (gpt-oss); ``window`` > 0: a query at position p sees positions p - window + 1 .. p only.
    """
    if sinks is not None or window > 0:
        return _paged_attention_masked(q, gather, seqs, block_size, sinks, window)
    T, H, hd = q.shape
    out = torch.empty(T, H, hd, dtype=q.dtype, device=q.device)
    offsets = torch.arange(block_size, device=q.device)
    for s in seqs:
        slots = (s.block_table[:, None] * block_size + offsets).flatten()[:s.ctx_len]   # [C]
        k, v = gather(slots)                                             # [C, Hkv, hd]
        rep = H // k.shape[1]
        k = k.transpose(0, 1).repeat_interleave(rep, 0)                  # [H, C, hd]
        v = v.transpose(0, 1).repeat_interleave(rep, 0)
        qs = q[s.q_start:s.q_start + s.q_len].transpose(0, 1)            # [H, q_len, hd]
        mask = None
        if 1 < s.q_len < s.ctx_len:
            qpos = torch.arange(s.ctx_len - s.q_len, s.ctx_len, device=q.device)
            mask = torch.arange(s.ctx_len, device=q.device)[None, :] <= qpos[:, None]   # [q_len, C]
        # 4-d inputs: with 3-d ones torch takes its unfused math path (several times slower on the CPU)
        o = F.scaled_dot_product_attention(qs[None], k.to(qs.dtype)[None], v.to(qs.dtype)[None], attn_mask=mask,
                                           is_causal=s.q_len == s.ctx_len and s.q_len > 1)[0]
        out[s.q_start:s.q_start + s.q_len] = o.transpose(0, 1)
    return out.reshape(T, H * hd)


def _paged_attention_masked(q: torch.Tensor, gather: Gather, seqs: list[SeqSlice], block_size: int,
                            sinks: torch.Tensor | None, window: int) -> torch.Tensor:
    """:func:`paged_attention_ref` with sinks or a sliding window: explicit scores, float32 inside."""
    from kernels.paged_attention import _attend_with_sinks
    T, H, hd = q.shape
    out = torch.empty(T, H, hd, dtype=q.dtype, device=q.device)
    offsets = torch.arange(block_size, device=q.device)
    zero_sinks = None if sinks is not None else torch.full((H,), float("-inf"), device=q.device)
    for s in seqs:
        first = max(0, s.ctx_len - s.q_len - window + 1) if window > 0 else 0   # oldest key any query sees
        slots = (s.block_table[:, None] * block_size + offsets).flatten()[first:s.ctx_len]   # [C']
        k, v = gather(slots)                                             # [C', Hkv, hd]
        qpos = torch.arange(s.ctx_len - s.q_len, s.ctx_len, device=q.device)
        kpos = torch.arange(first, s.ctx_len, device=q.device)
        mask = kpos[None, :] <= qpos[:, None]                            # [q_len, C']
        if window > 0:
            mask &= kpos[None, :] > qpos[:, None] - window
        qs = q[s.q_start:s.q_start + s.q_len].transpose(0, 1)[None]      # [1, H, q_len, hd]
        o = _attend_with_sinks(qs, k[None], v[None], mask[None, None], 1.0 / hd ** 0.5,
                               sinks if sinks is not None else zero_sinks)   # [1, H, q_len, hd]
        out[s.q_start:s.q_start + s.q_len] = o[0].transpose(0, 1)
    return out.reshape(T, H * hd)


def mlp(x: torch.Tensor, gate_up: torch.Tensor | QuantWeight, down: torch.Tensor | QuantWeight, kernel: bool = False) -> torch.Tensor:
    """SwiGLU MLP. x [T, D], gate_up [2F, D], down [D, F] -> [T, D]; ``kernel``: 8-bit matrices
    through the Triton kernel (CUDA), else the reference (:func:`kernels.qlinear.linear`)."""
    h = linear(x, gate_up, kernel=kernel)                                # [T, 2F]
    f = gate_up.shape[0] // 2
    return linear(F.silu(h[:, :f]) * h[:, f:], down, kernel=kernel)
