"""Routing ids (and the slots they found) into mapped pinned host memory, without the copy engines.

``store_ids``: ``dst <- src`` (int64, 1-D) by a kernel; either side may be mapped host memory, so the
host can read a few ids without queueing a DMA behind megabytes of expert copies.

``publish_direct``: what a direct-read decode step records once per MoE layer inside its CUDA graph:
snapshot the layer's slot-table row, hand the step's fill slots to the experts missing from it, and
publish ids, slots found, fill slots and predictions for the host that follows the step.

Legend: E experts, N = T * k ids of the layer, NP predicted ids.
"""
from __future__ import annotations

import dataclasses

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.expert_claim import CHUNK_WORDS, COPY_BLOCK, COPY_PROGRAMS, copy_row_chunk
from kernels.moe_decode_common import SLOT_CPU  # an expert the host CPU computes this step (-3)

_BLOCK = 1024


@dataclasses.dataclass(frozen=True)
class CpuShareArgs:
    """What :func:`publish_direct` needs to hand a share of a layer's missing experts to the host CPU:
    the layer's input ``x [T, D]`` and routing weights ``tw`` (``[T * k]``) on the device; ``inputs``
    (float32, mapped host memory, at least ``T * D + T * k``) and ``flag`` (int32 [1], mapped; the host
    sets it to 0 before the step) that receive them; ``frac`` (float32 [1], mapped or on the device):
    the share of the missing experts the host CPU takes."""

    x: torch.Tensor
    tw: torch.Tensor
    inputs: torch.Tensor
    flag: torch.Tensor
    frac: torch.Tensor


@dataclasses.dataclass(frozen=True)
class GatherArgs:
    """What :func:`publish_direct` needs to let each missing expert that more than one real token uses
    cross the bus once (:func:`gather_copy` then copies them): ``slots`` (int32 ``[1 + G]``: how many
    of the step's gather slots there are, then the slots; one layer's gathered experts at a time),
    ``work`` (int64 ``[1 + 2 N]``: how many experts to copy, then their (slot, store row) pairs) and
    the store row of the layer's expert 0, ``base``; ``min_uses``: the real tokens that must use a
    missing expert for it to be gathered (1: every missing expert)."""

    slots: torch.Tensor
    work: torch.Tensor
    base: int
    min_uses: int = 2


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
                           pad, x, tw, cpu_in, cpu_flag, cpu_frac, g_slots, g_work, g_base,
                           layer, E, N, NP, K, T, D, stride_x,
                           BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
                           BLOCK_D: tl.constexpr, PROGRESS: tl.constexpr, PAD: tl.constexpr, CPU: tl.constexpr,
                           SYS: tl.constexpr, GATHER: tl.constexpr, MIN_USES: tl.constexpr):
    # One program: snapshot the slot-table row (and clear the fill row), then publish the ids and
    # the slot each id found in that snapshot (after a barrier: the snapshot is what the MoE
    # kernels will read); give each missing expert, at its first occurrence, the next of the
    # step's fill slots while any are left; publish each id's fill slot and the predicted ids.
    # With PAD, the ids of a padding row (pad[row], K ids a row) become row 0's, in place.
    # With CPU, the host CPU takes round(cpu_frac * missing experts) of them, those most tokens
    # use first (each token re-reads a directly read expert; with GATHER, where each crosses the bus
    # once, those fewest tokens use: less work for the host), then by first occurrence: their
    # snapshot entry becomes SLOT_CPU (no fill slot, no read by the kernels), and x [T, D] and the
    # routing weights tw [T, K] (float32) go to cpu_in, then 1 to cpu_flag (after a system fence).
    # With GATHER, each missing expert (not the host CPU's) that MIN_USES or more real tokens use is copied
    # once, by the gather copy that follows, into its fill slot or else the next of g_slots (while any
    # are left); the region publishes that slot as its fill slot and its snapshot entry becomes the
    # slot once the region is written, so the MoE kernels read it from device memory.
    i = tl.arange(0, BLOCK_N)
    i_ok = i < N
    j = tl.arange(0, BLOCK_N)
    j_ok = j < N
    real_i = i_ok                                   # pairs of real rows (padding repeats row 0)
    real_j = j_ok
    if PAD:
        padded = tl.load(pad + i // K, mask=i_ok, other=0) != 0
        tl.store(ids + i, tl.load(ids + i % K, mask=i_ok, other=0), mask=i_ok & padded)
        real_i = i_ok & (tl.load(pad + i // K, mask=i_ok, other=1) == 0)
        real_j = j_ok & (tl.load(pad + j // K, mask=j_ok, other=1) == 0)
    e = tl.arange(0, BLOCK_E)
    tl.store(snap_row + e, tl.load(table_row + e, mask=e < E, other=-1), mask=e < E)
    tl.store(fill_row + e, tl.full([BLOCK_E], -1, tl.int32), mask=e < E)
    tl.debug_barrier()
    idv = tl.load(ids + i, mask=i_ok, other=0)
    seen = tl.load(snap_row + idv, mask=i_ok, other=-1)
    tl.store(region + i, idv.to(tl.int64), mask=i_ok)
    idj = tl.load(ids + j, mask=j_ok, other=-1)
    same = (idj[None, :] == idv[:, None]) & i_ok[:, None] & j_ok[None, :]         # [N, N], symmetric
    earlier = same & (j[None, :] < i[:, None])
    first = i_ok & (seen < 0) & (tl.sum(earlier.to(tl.int32), axis=1) == 0)
    if CPU:   # tokens of real rows that use each pair's expert, along i and along j
        uses = tl.sum((same & real_j[None, :]).to(tl.int32), axis=1)
        uses_j = tl.sum((same & real_i[:, None]).to(tl.int32), axis=0)
        seen_j = tl.load(snap_row + tl.where(j_ok, idj, 0), mask=j_ok, other=0)
        first_j = j_ok & (seen_j < 0) & (tl.sum((same & (i[:, None] < j[None, :])).to(tl.int32), axis=0) == 0)
        if GATHER:   # every missing expert crosses the bus once: the CPU takes those fewest tokens use
            ahead = first_j[None, :] & ((uses_j[None, :] < uses[:, None]) |
                                        ((uses_j[None, :] == uses[:, None]) & (j[None, :] < i[:, None])))
        else:
            ahead = first_j[None, :] & ((uses_j[None, :] > uses[:, None]) |
                                        ((uses_j[None, :] == uses[:, None]) & (j[None, :] < i[:, None])))
        rank = tl.sum(ahead.to(tl.int32), axis=1)                                 # among the missing
        missing = tl.sum(first.to(tl.int32), axis=0)
        quota = (tl.load(cpu_frac, volatile=True) * missing.to(tl.float32) + 0.5).to(tl.int32)
        mine = first & (rank < quota)
        tl.store(snap_row + idv, tl.full([BLOCK_N], -3, tl.int32), mask=mine)     # SLOT_CPU
        first = first & (rank >= quota)
    nfirst = first.to(tl.int32)
    pos = tl.load(fill_meta) + tl.cumsum(nfirst, axis=0) - nfirst
    got = first & (pos < tl.load(fill_meta + 1))
    fslot = tl.load(fill_free + pos, mask=got, other=-1)
    tl.store(fill_row + idv, fslot, mask=got)
    tl.store(fill_meta, tl.minimum(tl.load(fill_meta) + tl.sum(nfirst, axis=0), tl.load(fill_meta + 1)))
    if GATHER:
        if not CPU:
            uses = tl.sum((same & real_j[None, :]).to(tl.int32), axis=1)
        multi = first & (uses >= MIN_USES)
        scratch = (multi & ~got).to(tl.int32)
        spos = tl.cumsum(scratch, axis=0) - scratch
        sgot = (scratch != 0) & (spos < tl.load(g_slots))
        sslot = tl.load(g_slots + 1 + spos, mask=sgot, other=-1)
        tl.store(fill_row + idv, sslot, mask=sgot)
        gathered = multi & (got | sgot)
        target = tl.where(got, fslot, sslot)
        ng = gathered.to(tl.int32)
        gpos = tl.cumsum(ng, axis=0) - ng
        tl.store(g_work + 1 + 2 * gpos, target.to(tl.int64), mask=gathered)
        tl.store(g_work + 2 + 2 * gpos, g_base + idv.to(tl.int64), mask=gathered)
        tl.store(g_work, tl.sum(ng, axis=0).to(tl.int64))
    tl.debug_barrier()
    tl.store(region + N + i, tl.load(snap_row + idv, mask=i_ok, other=-1).to(tl.int64), mask=i_ok)
    tl.store(region + 2 * N + i, tl.load(fill_row + idv, mask=i_ok, other=-1).to(tl.int64), mask=i_ok)
    p = tl.arange(0, BLOCK_P)
    tl.store(region + 3 * N + p, tl.load(pred + p, mask=p < NP, other=0).to(tl.int64), mask=p < NP)
    if GATHER:   # the region holds what the host reads (-1: missing); now the kernels' view
        tl.debug_barrier()
        tl.store(snap_row + idv, target, mask=gathered)
    if CPU:
        if quota > 0:  # the host CPU's inputs, then the flag it waits for
            d = tl.arange(0, BLOCK_D)
            for t in range(T):
                for d0 in range(0, D, BLOCK_D):
                    v = tl.load(x + t * stride_x + d0 + d, mask=d0 + d < D, other=0.0)
                    tl.store(cpu_in + t * D + d0 + d, v.to(tl.float32), mask=d0 + d < D)
            tl.store(cpu_in + T * D + i, tl.load(tw + i, mask=i_ok, other=0.0).to(tl.float32), mask=i_ok)
            tl.debug_barrier()
            if SYS:  # the inputs reach host memory before the flag does
                tl.inline_asm_elementwise("fence.sc.sys;\n mov.b32 $0, $1;", "=r,r", [quota], dtype=tl.int32,
                                          is_pure=False, pack=1)
            tl.store(cpu_flag, 1)
    if PROGRESS:   # for the GPU-side prefetch: this layer's snapshot is taken
        tl.store(progress, layer)


def publish_direct(table_row: torch.Tensor, snap_row: torch.Tensor, ids: torch.Tensor,
                   pred: torch.Tensor | None, region: torch.Tensor, fill_row: torch.Tensor,
                   fill_free: torch.Tensor, fill_meta: torch.Tensor, progress: torch.Tensor | None = None,
                   layer: int = 0, pad: torch.Tensor | None = None, cpu: CpuShareArgs | None = None,
                   gather: GatherArgs | None = None) -> None:
    """Device work only (graph-capturable): ``snap_row <- table_row`` ([E] int32); ``fill_row`` [E]
    int32 <- for each expert of ``ids`` missing from the snapshot, at its first occurrence, the next
    slot of ``fill_free`` (from ``fill_meta = [next, count]``, advanced) or -1; then into the pinned
    int64 ``region``: ``ids`` [N], the slot each found in the snapshot [N], the fill slot of each [N],
    and ``pred`` [NP] if given. ``progress`` (int32 [1], optional) <- ``layer`` once the snapshot is taken.

    ``pad`` (bool [T], optional; ``ids`` is then [T, k] flattened): first, in place, the ids of each
    padding row become row 0's, so padding adds no reads of its own (one launch instead of a
    ``where`` and a copy per layer).

    ``cpu`` (optional): the host CPU takes ``round(frac * m)`` of the layer's ``m`` missing experts,
    those the most tokens use first: their snapshot entry (and so their published slot) becomes
    ``SLOT_CPU``, they get no fill slot, and when there is any, ``x`` and the routing weights go to
    ``cpu.inputs`` (float32 ``[T * D + T * k]``) and then 1 to ``cpu.flag`` (see :class:`CpuShareArgs`).

    ``gather`` (optional): each missing expert not the host CPU's that ``gather.min_uses`` or more real
    rows use gets a slot to be copied into once (its fill slot, else the next of ``gather.slots``); the pairs go to
    ``gather.work`` for :func:`gather_copy`, the region's fill column names that slot, and after the
    region is written its snapshot entry becomes the slot."""
    e, n = table_row.numel(), ids.numel()
    np_ = 0 if pred is None else pred.numel()
    if region.numel() < 3 * n + np_:
        raise ValueError(f"the publish region holds {region.numel()} ids; this layer publishes {3 * n + np_}")
    k = n // pad.numel() if pad is not None and pad.numel() else 1
    if cpu is not None:
        t, d = cpu.x.shape
        k = n // t
        if cpu.inputs.numel() < t * d + n or cpu.tw.numel() != n:
            raise ValueError(f"the CPU share's inputs hold {cpu.inputs.numel()} floats; x [{t}, {d}] and "
                             f"{n} routing weights need {t * d + n}")
        x, tw, inputs, flag, frac, sx = cpu.x, cpu.tw, cpu.inputs, cpu.flag, cpu.frac, cpu.x.stride(0)
    else:
        t = d = sx = 0
        x = tw = inputs = flag = frac = fill_meta
    if gather is not None:
        most = min(e, n // gather.min_uses)      # each expert gathered takes min_uses of the layer's pairs
        if gather.work.numel() < 1 + 2 * most:
            raise ValueError(f"the gather list holds {gather.work.numel()} values; this layer may need {1 + 2 * most}")
        g_slots, g_work, g_base = gather.slots, gather.work, gather.base
    else:
        g_slots, g_work, g_base = fill_meta, region, 0
    _publish_direct_kernel[(1,)](table_row, snap_row, ids, ids if pred is None else pred, region, fill_row, fill_free,
                                 fill_meta, fill_meta if progress is None else progress, ids if pad is None else pad,
                                 x, tw, inputs, flag, frac, g_slots, g_work, g_base, layer, e, n, np_, k, t, d, sx,
                                 BLOCK_E=next_pow2(e), BLOCK_N=next_pow2(max(n, 1)),
                                 BLOCK_P=next_pow2(max(np_, 1)), BLOCK_D=min(1024, next_pow2(max(d, 1))),
                                 PROGRESS=progress is not None, PAD=pad is not None, CPU=cpu is not None,
                                 SYS=cpu is not None and ids.device.type == "cuda", GATHER=gather is not None,
                                 MIN_USES=gather.min_uses if gather is not None else 2)


def publish_direct_ref(table_row: torch.Tensor, snap_row: torch.Tensor, ids: torch.Tensor,
                       pred: torch.Tensor | None, region: torch.Tensor, fill_row: torch.Tensor,
                       fill_free: torch.Tensor, fill_meta: torch.Tensor, progress: torch.Tensor | None = None,
                       layer: int = 0, pad: torch.Tensor | None = None, cpu: CpuShareArgs | None = None,
                       gather: GatherArgs | None = None) -> None:
    """:func:`publish_direct` in plain torch and Python (the same arguments, the same writes)."""
    flat = ids.view(-1)
    if pad is not None and pad.numel():
        k = flat.numel() // pad.numel()
        rows = flat.view(-1, k)
        rows[pad.bool()] = rows[0].clone()
    snap_row.copy_(table_row)
    fill_row.fill_(-1)
    id_list = flat.tolist()
    seen = snap_row[flat.long()].tolist()                                           # [N]
    nxt, count = fill_meta.tolist()
    first = [x for i, x in enumerate(id_list) if seen[i] < 0 and x not in id_list[:i]]
    mine: list[int] = []
    k = 1
    if pad is not None and pad.numel():
        k = flat.numel() // pad.numel()
    elif cpu is not None:
        k = flat.numel() // cpu.x.shape[0]
    real = [x for i, x in enumerate(id_list) if pad is None or not pad.numel() or not bool(pad[i // k])]
    uses = {x: real.count(x) for x in first}
    if cpu is not None and first:
        sign = 1 if gather is not None else -1          # gathered: fewest uses first (see the kernel)
        order = sorted(first, key=lambda x: (sign * uses[x], id_list.index(x)))
        quota = int(float(cpu.frac.view(-1)[0]) * len(first) + 0.5)
        mine = order[:quota]
        for x in mine:
            snap_row[x] = SLOT_CPU
        first = [x for x in first if x not in mine]
    for j, x in enumerate(first):
        if nxt + j < count:
            fill_row[x] = fill_free[nxt + j]
    fill_meta[0] = min(nxt + len(first), count)
    gathered: list[tuple[int, int]] = []          # (expert, slot)
    if gather is not None:
        free = gather.slots.tolist()
        scratch = iter(free[1:1 + free[0]])
        for x in first:
            if uses[x] < gather.min_uses:
                continue
            slot = int(fill_row[x]) if int(fill_row[x]) >= 0 else next(scratch, -1)
            if slot >= 0:
                fill_row[x] = slot
                gathered.append((x, slot))
        gather.work[0] = len(gathered)
        for j, (x, slot) in enumerate(gathered):
            gather.work[1 + 2 * j], gather.work[2 + 2 * j] = slot, gather.base + x
    n = len(id_list)
    region[:n] = flat.to(torch.int64)
    region[n:2 * n] = snap_row[flat.long()].to(torch.int64)
    region[2 * n:3 * n] = fill_row[flat.long()].to(torch.int64)
    if pred is not None:
        region[3 * n:3 * n + pred.numel()] = pred.view(-1).to(torch.int64)
    for x, slot in gathered:
        snap_row[x] = slot
    if mine:
        t, d = cpu.x.shape
        cpu.inputs[:t * d] = cpu.x.reshape(-1).float().to(cpu.inputs.device)
        cpu.inputs[t * d:t * d + n] = cpu.tw.reshape(-1).float().to(cpu.inputs.device)
        cpu.flag.fill_(1)
    if progress is not None:
        progress.fill_(layer)


@jit
def _gather_copy_kernel(rows, pool, work, W, NCHUNK, NPROG, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.load(work)
    for u in range(tl.program_id(0), n * NCHUNK, NPROG):
        copy_row_chunk(rows, pool, work + 1, u, W, NCHUNK, CHUNK, BLOCK)


def gather_copy(work: torch.Tensor, rows: torch.Tensor, pool: torch.Tensor, chunk_words: int = CHUNK_WORDS,
                copy_block: int = COPY_BLOCK, programs: int = COPY_PROGRAMS) -> None:
    """Device work only (graph-capturable): the (slot, row) pairs :func:`publish_direct` listed in
    ``work`` (int64 ``[1 + 2 N]``), host store ``rows [R, nbytes]`` (mapped) -> ``pool [S, nbytes]``,
    on the current stream, so the layer's MoE kernels after it find them."""
    if rows.shape[1] % 4 or pool.shape[1] != rows.shape[1]:
        raise ValueError(f"the gather copies rows as int32 words between equal rows; got rows "
                         f"{tuple(rows.shape)}, pool {tuple(pool.shape)}")
    rows32, pool32 = rows.view(torch.int32), pool.view(torch.int32)
    w = rows32.shape[1]
    _gather_copy_kernel[(programs,)](rows32, pool32, work, w, cdiv(w, chunk_words), programs,
                                     CHUNK=chunk_words, BLOCK=copy_block, num_warps=8)


def gather_copy_ref(work: torch.Tensor, rows: torch.Tensor, pool: torch.Tensor) -> None:
    """:func:`gather_copy` in torch."""
    for j in range(int(work[0])):
        pool[int(work[1 + 2 * j])].copy_(rows[int(work[2 + 2 * j])])
