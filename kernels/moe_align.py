"""Token -> expert alignment for the grouped (prefill) MoE GEMM.

The T*k (token, expert) pairs are numbered ``p = t * k + j`` (row-major ``topk_ids``). They are
sorted by expert (stably: by pair number within an expert) and each expert's group is padded to a
multiple of the block size M, so every block of M sorted entries belongs to one expert and one GEMM
program can stream that expert's weights once for up to M tokens.

Everything is computed on the device without a host sync: the tables are sized for the worst case
(``B_max = ceil(T*k / M) + min(E, T*k)`` blocks) and ``num_padded`` says how much is used; blocks past
it carry expert and slot -1. Expert ids must lie in ``[0, E)``; they are not checked (that would sync).

Legend: T tokens, k experts per token, E experts, P = T*k pairs, M block size, B blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._triton import cdiv, jit, next_pow2, tl

# The alignment in chunks counted and placed in parallel (three launches) rather than in one program
# (one launch, its loops serial: about 0.13 ms at 4096 pairs over 128 experts on the H100). Off: in a
# 512-token prefill the GPU was busy 1.4 ms less with it and the wall time was longer and spread
# (H100, benchmarks/results/step_profile_2026-12-06c.json; benchmarks/step_profile.py +palign).
PARALLEL = False
# Warps of the one-program alignment: its loops' reductions over [BLOCK_P, E] tiles spread over them
# (benchmarks/step_profile.py +alignw8, +alignw16 measure more)
ALIGN_WARPS = 4


@dataclass(frozen=True)
class MoeAlignment:
    """Index tables of one alignment; every tensor is int32 on the device of ``topk_ids``."""

    sorted_pairs: torch.Tensor    # [B_max * M] pair number p, or P (the padding marker)
    pair_position: torch.Tensor   # [P] where pair p sits in sorted_pairs (inverse permutation)
    block_expert: torch.Tensor    # [B_max] expert of each block; -1 past num_padded
    block_slot: torch.Tensor      # [B_max] pool slot of that expert; -1 past num_padded
    expert_offsets: torch.Tensor  # [E + 1] padded start of each expert's group; [E] = num_padded
    num_padded: torch.Tensor      # [1] used length of sorted_pairs (a multiple of M)
    block_m: int                  # M

    @property
    def max_blocks(self) -> int:
        return self.block_expert.numel()


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Worst-case number of M-blocks for ``num_pairs`` pairs over ``num_experts`` experts."""
    return cdiv(num_pairs, block_m) + min(num_experts, num_pairs)


def _check(topk_ids: torch.Tensor, slot_of_expert: torch.Tensor, block_m: int) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32/int64 [T, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if slot_of_expert.dim() != 1 or slot_of_expert.dtype != torch.int32:
        raise ValueError(f"slot_of_expert must be int32 [E], got {slot_of_expert.dtype} "
                         f"{tuple(slot_of_expert.shape)}")
    if slot_of_expert.device != topk_ids.device:
        raise ValueError("topk_ids and slot_of_expert must be on the same device")
    if block_m < 1:
        raise ValueError(f"block size must be positive, got {block_m}")


def moe_align_ref(topk_ids: torch.Tensor, slot_of_expert: torch.Tensor, block_m: int) -> MoeAlignment:
    """Plain-torch alignment (also free of host syncs); same tables as :func:`moe_align`."""
    _check(topk_ids, slot_of_expert, block_m)
    dev, e = topk_ids.device, slot_of_expert.numel()
    flat = topk_ids.flatten().long()                                   # [P]
    p = flat.numel()
    counts = torch.zeros(e, dtype=torch.long, device=dev).index_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m               # [E]
    offsets = torch.zeros(e + 1, dtype=torch.long, device=dev)
    offsets[1:] = torch.cumsum(padded, 0)                              # [E + 1]
    order = torch.sort(flat, stable=True).indices                      # [P] pairs by expert
    sorted_e = flat[order]
    first_of_e = torch.cumsum(counts, 0) - counts                      # [E] unpadded starts
    pos = offsets[sorted_e] + torch.arange(p, device=dev) - first_of_e[sorted_e]  # [P]
    nb = max_blocks(p, e, block_m)
    sorted_pairs = torch.full((nb * block_m,), p, dtype=torch.int32, device=dev)
    sorted_pairs[pos] = order.to(torch.int32)
    pair_position = torch.empty(p, dtype=torch.int32, device=dev)
    pair_position[order] = pos.to(torch.int32)
    starts = torch.arange(nb, device=dev) * block_m                    # [B]
    block_e = torch.searchsorted(offsets[1:], starts, right=True)       # [B] group holding each start
    used = starts < offsets[e]
    block_expert = torch.where(used, block_e, -1).to(torch.int32)
    block_slot = torch.where(used, slot_of_expert[block_e.clamp(max=e - 1)], -1).to(torch.int32)
    return MoeAlignment(sorted_pairs, pair_position, block_expert, block_slot, offsets.to(torch.int32),
                        offsets[e:].to(torch.int32), block_m)


@jit
def _block_tables(slot_ptr, bexp_ptr, bslot_ptr, ends, total, E, NB, M: tl.constexpr, BLOCK_B: tl.constexpr,
                  BLOCK_E: tl.constexpr):
    """Block b holds expert e when e's padded group (ending at ``ends[e]``) contains b * M (empty groups
    have no length); blocks from ``total`` on hold none (-1)."""
    cols = tl.arange(0, BLOCK_E)
    for b0 in range(0, NB, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        first = b * M
        e = tl.sum(((ends[None, :] <= first[:, None]) & (cols[None, :] < E)).to(tl.int32), axis=1)
        used = (first < total) & (b < NB)
        slot = tl.load(slot_ptr + e, mask=used, other=-1)
        tl.store(bexp_ptr + b, tl.where(used, e, -1), mask=b < NB)
        tl.store(bslot_ptr + b, tl.where(used, slot, -1), mask=b < NB)


@jit
def _moe_align_kernel(ids_ptr, slot_ptr, sorted_ptr, pos_ptr, bexp_ptr, bslot_ptr, off_ptr, npad_ptr,
                      P, E, NB, M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr):
    cols = tl.arange(0, BLOCK_E)                                        # [BE] expert ids
    rows = tl.arange(0, BLOCK_P)                                        # [BP]
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, P, BLOCK_P):
        ids = tl.load(ids_ptr + p0 + rows, mask=p0 + rows < P, other=-1)
        counts += tl.sum((ids[:, None] == cols[None, :]).to(tl.int32), axis=0)
    padded = (counts + M - 1) // M * M                                  # [BE]
    ends = tl.cumsum(padded, axis=0)                                    # [BE] padded group ends
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(off_ptr + cols, starts, mask=cols < E)
    tl.store(off_ptr + E, total)
    tl.store(npad_ptr, total)
    # Scatter: a pair's place = its expert's start + pairs of that expert seen before it.
    seen = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, P, BLOCK_P):
        pr = p0 + rows
        ids = tl.load(ids_ptr + pr, mask=pr < P, other=-1)
        hot = (ids[:, None] == cols[None, :]).to(tl.int32)              # [BP, BE] one-hot
        before = tl.cumsum(hot, axis=0) - hot                           # same expert, earlier in chunk
        pos = tl.sum(hot * (before + (starts + seen)[None, :]), axis=1)  # [BP]
        tl.store(sorted_ptr + pos, pr, mask=pr < P)
        tl.store(pos_ptr + pr, pos, mask=pr < P)
        seen += tl.sum(hot, axis=0)
    _block_tables(slot_ptr, bexp_ptr, bslot_ptr, ends, total, E, NB, M, BLOCK_P, BLOCK_E)


@jit
def _align_count_kernel(ids_ptr, counts_ptr, P, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr):
    """Chunk ``program_id(0)`` of ``BLOCK_P`` pairs: how many of them each expert has."""
    c = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    pr = c * BLOCK_P + tl.arange(0, BLOCK_P)
    ids = tl.load(ids_ptr + pr, mask=pr < P, other=-1)
    tl.store(counts_ptr + c * BLOCK_E + cols, tl.sum((ids[:, None] == cols[None, :]).to(tl.int32), axis=0))


@jit
def _align_scan_kernel(counts_ptr, slot_ptr, bexp_ptr, bslot_ptr, off_ptr, npad_ptr, E, NB, C,
                       M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr):
    """One program: the experts' padded groups from the chunks' counts, each chunk's first place per
    expert (its group's start + that expert's pairs in the chunks before it, written over the counts),
    and the block tables."""
    cols = tl.arange(0, BLOCK_E)
    rows = tl.arange(0, BLOCK_C)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c0 in range(0, C, BLOCK_C):
        ok = (c0 + rows < C)[:, None] & (cols < BLOCK_E)[None, :]
        counts += tl.sum(tl.load(counts_ptr + (c0 + rows)[:, None] * BLOCK_E + cols[None, :], mask=ok, other=0),
                         axis=0)
    padded = (counts + M - 1) // M * M                                  # [BE]
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(off_ptr + cols, starts, mask=cols < E)
    tl.store(off_ptr + E, total)
    tl.store(npad_ptr, total)
    seen = starts
    for c0 in range(0, C, BLOCK_C):
        ok = (c0 + rows < C)[:, None] & (cols < BLOCK_E)[None, :]
        at = counts_ptr + (c0 + rows)[:, None] * BLOCK_E + cols[None, :]
        tile = tl.load(at, mask=ok, other=0)                           # [BC, BE]
        tl.store(at, tl.cumsum(tile, axis=0) - tile + seen[None, :], mask=ok)
        seen += tl.sum(tile, axis=0)
    _block_tables(slot_ptr, bexp_ptr, bslot_ptr, ends, total, E, NB, M, BLOCK_B, BLOCK_E)


@jit
def _align_scatter_kernel(ids_ptr, base_ptr, sorted_ptr, pos_ptr, P, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr):
    """Chunk ``program_id(0)``: each pair's place, its expert's first place for the chunk + the pairs of
    that expert before it in the chunk."""
    c = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    pr = c * BLOCK_P + tl.arange(0, BLOCK_P)
    ids = tl.load(ids_ptr + pr, mask=pr < P, other=-1)
    hot = (ids[:, None] == cols[None, :]).to(tl.int32)                  # [BP, BE] one-hot
    before = tl.cumsum(hot, axis=0) - hot
    base = tl.load(base_ptr + c * BLOCK_E + cols)                       # [BE]
    pos = tl.sum(hot * (before + base[None, :]), axis=1)                # [BP]
    tl.store(sorted_ptr + pos, pr, mask=pr < P)
    tl.store(pos_ptr + pr, pos, mask=pr < P)


def moe_align(topk_ids: torch.Tensor, slot_of_expert: torch.Tensor, block_m: int) -> MoeAlignment:
    """Triton alignment (no host sync): in one program, or with ``PARALLEL`` in chunks of pairs counted
    and placed by programs of their own around one program that scans the counts.
    ``topk_ids [T, k]``, ``slot_of_expert [E]`` int32."""
    _check(topk_ids, slot_of_expert, block_m)
    dev, e = topk_ids.device, slot_of_expert.numel()
    ids = topk_ids.contiguous().view(-1)
    p = ids.numel()
    nb = max_blocks(p, e, block_m)
    sorted_pairs = torch.full((nb * block_m,), p, dtype=torch.int32, device=dev)
    pair_position = torch.empty(p, dtype=torch.int32, device=dev)
    block_expert = torch.empty(nb, dtype=torch.int32, device=dev)
    block_slot = torch.empty(nb, dtype=torch.int32, device=dev)
    offsets = torch.empty(e + 1, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    block_e = next_pow2(e)
    block_p = max(16, min(256, 8192 // block_e))
    if PARALLEL:
        chunks = cdiv(p, block_p)
        base = torch.empty(chunks * block_e, dtype=torch.int32, device=dev)      # counts, then first places
        _align_count_kernel[(chunks,)](ids, base, p, BLOCK_P=block_p, BLOCK_E=block_e)
        _align_scan_kernel[(1,)](base, slot_of_expert, block_expert, block_slot, offsets, num_padded, e, nb,
                                 chunks, M=block_m, BLOCK_C=max(1, 8192 // block_e), BLOCK_E=block_e,
                                 BLOCK_B=block_p)
        _align_scatter_kernel[(chunks,)](ids, base, sorted_pairs, pair_position, p, BLOCK_P=block_p,
                                         BLOCK_E=block_e)
    else:
        _moe_align_kernel[(1,)](ids, slot_of_expert, sorted_pairs, pair_position, block_expert, block_slot,
                                offsets, num_padded, p, e, nb, M=block_m, BLOCK_P=block_p, BLOCK_E=block_e,
                                num_warps=ALIGN_WARPS if p >= 1024 else 4)
    return MoeAlignment(sorted_pairs, pair_position, block_expert, block_slot, offsets, num_padded, block_m)
