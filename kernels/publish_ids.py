"""Routing ids (and the slots they found) into mapped pinned host memory, without the copy engines.

``store_ids``: ``dst <- src`` (int64, 1-D) by a kernel; either side may be mapped host memory, so the
host can read a few ids without queueing a DMA behind megabytes of expert copies.

``publish_direct``: what a direct-read decode step records once per MoE layer inside its CUDA graph:
snapshot the layer's slot-table row, hand the step's fill slots to the experts missing from it, and
publish ids, slots found, fill slots and predictions for the host that follows the step.

Legend: E experts, N = T * k ids of the layer, NP predicted ids.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, tl

_BLOCK = 1024


@jit
def _store_ids_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def store_ids(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst[:N] <- src`` for int64 ``src [N]``, by a kernel (graph-capturable, no sync)."""
    if src.dtype != torch.int64 or dst.dtype != torch.int64 or src.dim() != 1 or dst.numel() < src.numel():
        raise ValueError(f"store_ids takes int64 [N] into int64 [>= N]; got {src.dtype} {tuple(src.shape)} "
                         f"into {dst.dtype} {tuple(dst.shape)}")
    n = src.numel()
    _store_ids_kernel[(cdiv(n, _BLOCK),)](src, dst, n, BLOCK=_BLOCK)


def store_ids_ref(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst[:src.numel()].copy_(src)


@jit
def _publish_direct_kernel(table_row, snap_row, ids, pred, region, fill_row, fill_free, fill_meta, progress,
                           pad, layer, E, N, NP, K, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_P: tl.constexpr, PROGRESS: tl.constexpr, PAD: tl.constexpr):
    # One program: snapshot the slot-table row (and clear the fill row), then publish the ids and
    # the slot each id found in that snapshot (after a barrier: the snapshot is what the MoE
    # kernels will read); give each missing expert, at its first occurrence, the next of the
    # step's fill slots while any are left; publish each id's fill slot and the predicted ids.
    # With PAD, the ids of a padding row (pad[row], K ids a row) become row 0's, in place.
    i = tl.arange(0, BLOCK_N)
    i_ok = i < N
    if PAD:
        padded = tl.load(pad + i // K, mask=i_ok, other=0) != 0
        tl.store(ids + i, tl.load(ids + i % K, mask=i_ok, other=0), mask=i_ok & padded)
    e = tl.arange(0, BLOCK_E)
    tl.store(snap_row + e, tl.load(table_row + e, mask=e < E, other=-1), mask=e < E)
    tl.store(fill_row + e, tl.full([BLOCK_E], -1, tl.int32), mask=e < E)
    tl.debug_barrier()
    idv = tl.load(ids + i, mask=i_ok, other=0)
    seen = tl.load(snap_row + idv, mask=i_ok, other=-1)
    tl.store(region + i, idv.to(tl.int64), mask=i_ok)
    tl.store(region + N + i, seen.to(tl.int64), mask=i_ok)
    j = tl.arange(0, BLOCK_N)
    idj = tl.load(ids + j, mask=j < N, other=-1)
    earlier = (idj[None, :] == idv[:, None]) & (j[None, :] < i[:, None])          # [N, N]
    first = i_ok & (seen < 0) & (tl.sum(earlier.to(tl.int32), axis=1) == 0)
    nfirst = first.to(tl.int32)
    pos = tl.load(fill_meta) + tl.cumsum(nfirst, axis=0) - nfirst
    got = first & (pos < tl.load(fill_meta + 1))
    tl.store(fill_row + idv, tl.load(fill_free + pos, mask=got, other=-1), mask=got)
    tl.store(fill_meta, tl.minimum(tl.load(fill_meta) + tl.sum(nfirst, axis=0), tl.load(fill_meta + 1)))
    tl.debug_barrier()
    tl.store(region + 2 * N + i, tl.load(fill_row + idv, mask=i_ok, other=-1).to(tl.int64), mask=i_ok)
    p = tl.arange(0, BLOCK_P)
    tl.store(region + 3 * N + p, tl.load(pred + p, mask=p < NP, other=0).to(tl.int64), mask=p < NP)
    if PROGRESS:   # for the GPU-side prefetch: this layer's snapshot is taken
        tl.store(progress, layer)


def publish_direct(table_row: torch.Tensor, snap_row: torch.Tensor, ids: torch.Tensor,
                   pred: torch.Tensor | None, region: torch.Tensor, fill_row: torch.Tensor,
                   fill_free: torch.Tensor, fill_meta: torch.Tensor, progress: torch.Tensor | None = None,
                   layer: int = 0, pad: torch.Tensor | None = None) -> None:
    """Device work only (graph-capturable): ``snap_row <- table_row`` ([E] int32); ``fill_row`` [E]
    int32 <- for each expert of ``ids`` missing from the snapshot, at its first occurrence, the next
    slot of ``fill_free`` (from ``fill_meta = [next, count]``, advanced) or -1; then into the pinned
    int64 ``region``: ``ids`` [N], the slot each found in the snapshot [N], the fill slot of each [N],
    and ``pred`` [NP] if given. ``progress`` (int32 [1], optional) <- ``layer`` once the snapshot is taken.

    ``pad`` (bool [T], optional; ``ids`` is then [T, k] flattened): first, in place, the ids of each
    padding row become row 0's, so padding adds no reads of its own (one launch instead of a
    ``where`` and a copy per layer)."""
    e, n = table_row.numel(), ids.numel()
    np_ = 0 if pred is None else pred.numel()
    if region.numel() < 3 * n + np_:
        raise ValueError(f"the publish region holds {region.numel()} ids; this layer publishes {3 * n + np_}")
    k = n // pad.numel() if pad is not None and pad.numel() else 1
    _publish_direct_kernel[(1,)](table_row, snap_row, ids, ids if pred is None else pred, region, fill_row, fill_free,
                                 fill_meta, fill_meta if progress is None else progress, ids if pad is None else pad,
                                 layer, e, n, np_, k, BLOCK_E=next_pow2(e), BLOCK_N=next_pow2(max(n, 1)),
                                 BLOCK_P=next_pow2(max(np_, 1)), PROGRESS=progress is not None, PAD=pad is not None)


def publish_direct_ref(table_row: torch.Tensor, snap_row: torch.Tensor, ids: torch.Tensor,
                       pred: torch.Tensor | None, region: torch.Tensor, fill_row: torch.Tensor,
                       fill_free: torch.Tensor, fill_meta: torch.Tensor, progress: torch.Tensor | None = None,
                       layer: int = 0, pad: torch.Tensor | None = None) -> None:
    """:func:`publish_direct` in plain torch and Python (the same arguments, the same writes)."""
    flat = ids.view(-1)
    if pad is not None and pad.numel():
        k = flat.numel() // pad.numel()
        rows = flat.view(-1, k)
        rows[pad.bool()] = rows[0].clone()
    snap_row.copy_(table_row)
    fill_row.fill_(-1)
    id_list = flat.tolist()
    seen = snap_row[flat.long()]                                                    # [N]
    nxt, count = fill_meta.tolist()
    first: list[int] = []
    for i, x in enumerate(id_list):
        if seen[i] < 0 and x not in id_list[:i]:
            first.append(x)
    for j, x in enumerate(first):
        if nxt + j < count:
            fill_row[x] = fill_free[nxt + j]
    fill_meta[0] = min(nxt + len(first), count)
    n = len(id_list)
    region[:n] = flat.to(torch.int64)
    region[n:2 * n] = seen.to(torch.int64)
    region[2 * n:3 * n] = fill_row[flat.long()].to(torch.int64)
    if pred is not None:
        region[3 * n:3 * n + pred.numel()] = pred.view(-1).to(torch.int64)
    if progress is not None:
        progress.fill_(layer)
