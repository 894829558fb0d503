"""Routed experts computed on the host CPU, straight from the host store's bytes.

:func:`cpu_expert_forward` is the kernel (numba, compiled for the CPU it runs on and cached on disk),
:func:`cpu_expert_forward_ref` the plain-torch reference built from :mod:`kernels.quant`'s
dequantisers. Both compute ``out[t] = sum over (expert e, token t, weight w) of w * FFN_e(x[t])`` in
float32, with each expert's format, biases and activation as its :class:`ExpertLayout` says.

The kernel reads each expert's row of the store in place: nothing is dequantised into memory, the
store is only read (so it may be pinned, mapped, or shared with copies to the GPU in flight).

Threads: each call runs two parallel passes, each ending at a barrier, so a call is as slow as its
slowest thread. A thread that shares its core with other work (the thread feeding the GPU, another
process) stalls the barrier by a scheduler time slice: measured on 2 shared cores, 2 threads took
7 ms where 1 took 0.9 ms. Use at most the cores the engine leaves free, and where the process sets its
environment at start, ``OMP_WAIT_POLICY=passive`` keeps idle workers from spinning on a busy host.

Legend: T tokens, D hidden, F expert FFN, R store rows (layers * experts), P (expert, token) pairs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numba
import numpy as np
import torch

from kernels.cpu import packed
from kernels.cpu.dots import FORMAT_CODES, INT4, MXFP4
from kernels.cpu.driver import M_FMT, M_G, M_S2, M_S13, expert_forward, packed_forward, packed_forward_one
from kernels.cpu.threads import set_numba_threads
from kernels.expert_layout import DENSE_DTYPES, ExpertLayout
from kernels.quant import dequantize_expert_matrix


@dataclass(frozen=True)
class CpuExpertWork:
    """Which experts run on the CPU for which tokens: expert ``i`` is store row ``rows[i]`` and serves
    pairs ``starts[i]:starts[i + 1]`` of ``tokens`` (token indices into ``x``) with ``weights``."""

    rows: np.ndarray        # int64 [E']
    starts: np.ndarray      # int64 [E' + 1]
    tokens: np.ndarray      # int64 [P]
    weights: np.ndarray     # float32 [P]

    @staticmethod
    def from_pairs(items: Sequence[tuple[int, Sequence[int] | torch.Tensor, Sequence[float] | torch.Tensor]]
                   ) -> "CpuExpertWork":
        """From ``[(store row, token indices, routing weights), ...]``, one entry per expert."""
        rows, starts, toks, wts = [], [0], [], []
        for row, t, w in items:
            t = np.asarray(t.tolist() if isinstance(t, torch.Tensor) else t, dtype=np.int64).reshape(-1)
            w = np.asarray(w.tolist() if isinstance(w, torch.Tensor) else w, dtype=np.float32).reshape(-1)
            if t.size != w.size:
                raise ValueError(f"store row {row}: {t.size} token indices but {w.size} routing weights; "
                                 "pass one weight per token")
            rows.append(int(row))
            toks.append(t)
            wts.append(w)
            starts.append(starts[-1] + t.size)
        cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
        return CpuExpertWork(np.asarray(rows, np.int64), np.asarray(starts, np.int64),
                             cat(toks, np.int64), cat(wts, np.float32))

    @property
    def experts(self) -> int:
        return int(self.rows.size)


# int4 and mxfp4: gate/up and down in one parallel region (kernels.cpu.packed.gate_up_down) rather than
# two; the result is the same to the bit. Off until the GPU host's 16 cores have measured it
# (benchmarks/cpu_phases.py times both).
ONE_REGION = False


def _kernel(meta: np.ndarray, one_region: bool | None = None):
    """The compiled entry point for a layout: the integer one for int4 and mxfp4 (in one parallel region
    or two: ``one_region``, default :data:`ONE_REGION`), the float one for the rest (each compiles on its
    first call only)."""
    fmt = int(meta[M_FMT])
    if fmt not in (INT4, MXFP4):
        return expert_forward
    why = packed.supports(fmt, int(meta[M_G]), int(meta[M_S13]), int(meta[M_S2]))
    if why is not None:
        raise ValueError(f"the CPU expert kernels cannot read {why}; use cold_experts=bus")
    return packed_forward_one if (ONE_REGION if one_region is None else one_region) else packed_forward


@lru_cache(maxsize=64)
def _meta(layout: ExpertLayout) -> np.ndarray:
    """The layout as the int64 vector the compiled kernel reads (order: kernels.cpu.driver.M_*);
    built once per layout (the kernel never writes it)."""
    def off(name: str) -> int:
        try:
            return layout.slice(name).offset
        except KeyError:
            return -1
    act = 0 if layout.act.kind == "silu" else 1
    return np.array([FORMAT_CODES[layout.fmt], layout.hidden, layout.ffn, layout.group_size,
                     off("w13"), off("w13_scale"), off("w13_zero"), off("w2"), off("w2_scale"), off("w2_zero"),
                     off("w13_bias"), off("w2_bias"), act], dtype=np.int64)


def _check(store: torch.Tensor, layout: ExpertLayout, work: CpuExpertWork, x: torch.Tensor) -> None:
    if store.device.type != "cpu" or store.dtype != torch.uint8 or store.dim() != 2 \
            or store.shape[1] != layout.nbytes or not store.is_contiguous():
        raise ValueError(f"the host store must be a contiguous CPU uint8 [rows, {layout.nbytes}] tensor, "
                         f"got {store.dtype} {tuple(store.shape)} on {store.device}")
    if x.device.type != "cpu" or x.dim() != 2 or x.shape[1] != layout.hidden \
            or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"x must be float32 or bfloat16 [T, {layout.hidden}] on the CPU, "
                         f"got {x.dtype} {tuple(x.shape)} on {x.device}")
    if work.rows.size and (work.rows.min() < 0 or work.rows.max() >= store.shape[0]):
        raise ValueError(f"a store row is outside 0..{store.shape[0] - 1}; pass rows of this store")
    if work.tokens.size and (work.tokens.min() < 0 or work.tokens.max() >= x.shape[0]):
        raise ValueError(f"a token index is outside 0..{x.shape[0] - 1}; pass indices into x")


def cpu_expert_forward(store: torch.Tensor, layout: ExpertLayout, work: CpuExpertWork, x: torch.Tensor,
                       out: torch.Tensor | None = None, threads: int | None = None,
                       one_region: bool | None = None) -> torch.Tensor:
    """Sum over ``work``'s experts of ``weight * FFN(x[token])``, as float32 ``[T, D]``.

    ``store``: uint8 ``[R, layout.nbytes]`` on the CPU (pinned or not; only read). ``x``: float32 or
    bfloat16 ``[T, D]``. ``out``: float32 ``[T, D]`` to write into (overwritten); tokens no expert
    serves get zeros. ``threads``: worker threads for this call (default: numba's current setting;
    :func:`kernels.cpu.threads.set_cpu_expert_threads` pins them).
    """
    _check(store, layout, work, x)
    t_ = x.shape[0]
    if out is None:
        out = torch.zeros(t_, layout.hidden, dtype=torch.float32)
    elif out.dtype != torch.float32 or tuple(out.shape) != (t_, layout.hidden) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{t_}, {layout.hidden}] tensor, "
                         f"got {out.dtype} {tuple(out.shape)}")
    else:
        out.zero_()
    if work.experts == 0:
        return out
    if threads is not None:
        set_numba_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    b = store.numpy()                                          # [R, nbytes] uint8, no copy
    xf = (x if x.dtype == torch.float32 and x.is_contiguous() else x.to(torch.float32).contiguous()).numpy()  # [T, D]
    act, meta = layout.act, _meta(layout)
    _kernel(meta, one_region)(b, b.view(np.uint16), b.view(np.float32), meta, np.float32(act.alpha), np.float32(act.limit),
                  work.rows, work.starts, work.tokens, work.weights, xf, out.numpy(), numba.get_num_threads())
    return out


class CpuExpertRunner:
    """:func:`cpu_expert_forward` for one store, layout and thread count, checked once: what a caller
    on the decode step's path uses, where every layer calls it (the checks, views and thread setting
    cost tens of microseconds a call). ``run(work, x, out)`` with float32 numpy ``x [T, D]`` and
    ``out [T, D]`` (overwritten); ``work``'s rows and tokens are the caller's to keep in range."""

    def __init__(self, store: torch.Tensor, layout: ExpertLayout, threads: int, one_region: bool | None = None) -> None:
        _check(store, layout, CpuExpertWork.from_pairs([]), torch.zeros(1, layout.hidden))
        self.store, self.layout = store, layout        # the tensor keeps the memory the views read
        b = store.numpy()
        self._views = (b, b.view(np.uint16), b.view(np.float32), _meta(layout),
                       np.float32(layout.act.alpha), np.float32(layout.act.limit))
        self.threads = max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
        self._fn = _kernel(self._views[3], one_region)

    def run(self, work: CpuExpertWork, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        out[:] = 0.0
        if work.experts == 0:
            return out
        if numba.get_num_threads() != self.threads:      # a per-thread setting: the caller's thread
            set_numba_threads(self.threads)
        self._fn(*self._views, work.rows, work.starts, work.tokens, work.weights, x, out, self.threads)
        return out


def _act_ref(h: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """``h [n, 2F]`` (gate, then up) -> ``[n, F]``; the formula of :class:`ExpertAct`."""
    gate, up = h[:, :layout.ffn], h[:, layout.ffn:]
    if layout.act.kind == "silu":
        return torch.nn.functional.silu(gate) * up
    gate = gate.clamp(max=layout.act.limit)
    up = up.clamp(-layout.act.limit, layout.act.limit)
    return (up + 1) * gate * torch.sigmoid(gate * layout.act.alpha)


def cpu_expert_forward_ref(store: torch.Tensor, layout: ExpertLayout, work: CpuExpertWork,
                           x: torch.Tensor) -> torch.Tensor:
    """Plain torch, same contract as :func:`cpu_expert_forward` (dequantises whole matrices: tests only)."""
    _check(store, layout, work, x)
    views = layout.views(store)
    xf = x.to(torch.float32)                                   # [T, D]
    out = torch.zeros(x.shape[0], layout.hidden, dtype=torch.float32)
    for i, row in enumerate(work.rows.tolist()):
        lo, hi = int(work.starts[i]), int(work.starts[i + 1])
        toks = torch.from_numpy(work.tokens[lo:hi])            # [n]
        w = torch.from_numpy(work.weights[lo:hi])              # [n]
        if layout.fmt in DENSE_DTYPES:
            w13, w2 = views["w13"][row].float(), views["w2"][row].float()
        else:
            w13 = dequantize_expert_matrix(views, "w13", row, layout, torch.float32)   # [2F, D]
            w2 = dequantize_expert_matrix(views, "w2", row, layout, torch.float32)     # [D, F]
        h = xf[toks] @ w13.t()                                 # [n, 2F]
        if layout.bias:
            h = h + views["w13_bias"][row]
        y = _act_ref(h, layout) @ w2.t()                       # [n, D]
        if layout.bias:
            y = y + views["w2_bias"][row]
        out.index_add_(0, toks, y * w[:, None])
    return out
