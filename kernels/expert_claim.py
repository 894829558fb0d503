"""GPU-side expert prefetch: claim staging slots for predicted experts, then copy them in.

Two kernels a direct-read decode step launches on a side stream right after layer ``l`` predicts
layer ``t = target`` (engine/experts/device_prefetch.py drives them):

* ``claim`` (one program) ranks the experts predicted for ``t`` by how many tokens predict them, ties
  by rank (first choices first), keeps those with no slot in the table and at least ``min_votes``
  votes, gives the first ``quota`` of them the next leased staging slots, marks their table entries
  ``CLAIMED`` and lists the claims for the copy kernel and, in pinned memory, for the host. It claims
  nothing once the compute stream has published layer ``t - 1`` (too late to land).
* ``copy`` (persistent programs) moves each claimed expert from the mapped host store into its slot
  in chunks; the program that completes an expert's last chunk publishes its slot in the table with
  release semantics, so a reader that sees the slot also sees its bytes.

Legend: T tokens, k experts per token, E experts, L MoE layers, MAXC most claims per launch,
W int32 words per expert row.
"""
from __future__ import annotations

import dataclasses

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.moe_decode_common import CLAIMED  # a table entry whose copy is under way (-4)

CHUNK_WORDS = 1 << 16        # int32 words per copy chunk (256 KiB)
COPY_PROGRAMS = 32           # persistent programs of the copy kernel
COPY_BLOCK = 4096            # int32 words one program moves per iteration


@dataclasses.dataclass(frozen=True)
class ClaimBuffers:
    """The device state the two kernels share across a step's launches."""
    free: torch.Tensor       # int32 [F]: the step's leased staging slots
    meta: torch.Tensor       # int32 [6]: next free, free count, quota, progress, claims this launch, min votes
    work: torch.Tensor       # int64 [2 MAXC]: (slot, key) of each claim of this launch
    done: torch.Tensor       # int32 [MAXC]: chunks copied of each claim
    regions: torch.Tensor    # int64 [L, 1 + 3 MAXC] (pinned on CUDA): count, keys, slots, votes per target
    num_experts: int
    max_claims: int


@jit
def _claim_kernel(pred, table, free, meta, work, done, region, target, T, E, N, MAXC,
                  K: tl.constexpr, BLOCK_N: tl.constexpr):
    # pred: [T, K] ids of layer ``target``; meta: [next, count, quota, progress, n, min_votes];
    # work: [MAXC, 2] (slot, key); region: pinned [1 + 3 MAXC] (count, keys, slots, votes).
    i = tl.arange(0, BLOCK_N)
    i_ok = i < N
    src = (i % T) * K + i // T                                     # rank-major: first choices first
    e = tl.load(pred + src, mask=i_ok, other=-1).to(tl.int64)
    j = tl.arange(0, BLOCK_N)
    ej = tl.load(pred + (j % T) * K + j // T, mask=j < N, other=-1).to(tl.int64)
    same = (ej[None, :] == e[:, None]) & i_ok[:, None]                              # [N, N]
    votes = tl.sum(same.to(tl.int32), axis=1)                      # tokens predicting e
    earlier = same & (j[None, :] < i[:, None])
    key = target * E + e
    state = tl.load(table + key, mask=i_ok, other=0)
    cand = i_ok & (tl.sum(earlier.to(tl.int32), axis=1) == 0) & (state == -1) & (votes >= tl.load(meta + 5))
    nxt, count, quota, progress = tl.load(meta), tl.load(meta + 1), tl.load(meta + 2), tl.load(meta + 3)
    quota = tl.where(progress < target - 1, quota, 0)             # too late to land: claim nothing
    # Candidates in order of votes, then of first occurrence: pos = candidates ahead of this one.
    score = tl.where(cand, votes * BLOCK_N + (BLOCK_N - 1 - i), -1)
    diag = i[:, None] == j[None, :]
    score_j = tl.sum(tl.where(diag, score[:, None], 0), axis=0)   # the same scores along j
    pos = tl.sum((score_j[None, :] > score[:, None]).to(tl.int32), axis=1)
    take = cand & (pos < quota) & (nxt + pos < count)
    slot = tl.load(free + nxt + pos, mask=take, other=-1)
    tl.store(table + key, tl.full([BLOCK_N], -4, tl.int32), mask=take)       # CLAIMED
    tl.store(work + 2 * pos, slot.to(tl.int64), mask=take)
    tl.store(work + 2 * pos + 1, key, mask=take)
    tl.store(done + pos, tl.zeros([BLOCK_N], tl.int32), mask=take)
    n = tl.sum(take.to(tl.int32), axis=0)
    tl.store(region + 1 + pos, key, mask=take)
    tl.store(region + 1 + MAXC + pos, slot.to(tl.int64), mask=take)
    tl.store(region + 1 + 2 * MAXC + pos, votes.to(tl.int64), mask=take)
    tl.store(meta + 4, n)                                           # the copy kernel's item count
    tl.store(meta, nxt + n)
    tl.debug_barrier()
    tl.store(region, n.to(tl.int64))


@jit
def copy_row_chunk(rows, pool, work, u, W, NCHUNK, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # Unit u of a copy list: chunk u % NCHUNK of item u // NCHUNK, whose (slot, key) are work[2i],
    # work[2i + 1] (int64): host store row ``key`` -> pool slot ``slot``, both int32 words [*, W].
    # Returns (item, slot, key).
    item = u // NCHUNK
    c = u % NCHUNK
    slot = tl.load(work + 2 * item)
    key = tl.load(work + 2 * item + 1)
    src = rows + key * W
    dst = pool + slot * W
    offs = tl.arange(0, BLOCK)
    for w0 in range(c * CHUNK, tl.minimum((c + 1) * CHUNK, W), BLOCK):
        o = w0 + offs
        ok = o < tl.minimum((c + 1) * CHUNK, W)
        tl.store(dst + o, tl.load(src + o, mask=ok), mask=ok)
    return item, slot, key


@jit
def _copy_kernel(rows, pool, work, done, meta, table, W, NCHUNK, NPROG,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # rows: host store as int32 [R, W]; pool: slots as int32 [S, W]; chunk c of item i is unit
    # i * NCHUNK + c; units are dealt round-robin to the programs.
    n = tl.load(meta + 4)
    for u in range(tl.program_id(0), n * NCHUNK, NPROG):
        item, slot, key = copy_row_chunk(rows, pool, work, u, W, NCHUNK, CHUNK, BLOCK)
        tl.debug_barrier()                                          # the program's stores, then its count
        if tl.atomic_add(done + item, 1, sem="acq_rel") == NCHUNK - 1:
            tl.atomic_xchg(table + key, slot.to(tl.int32), sem="release")


def claim_and_copy(buf: ClaimBuffers, target: int, pred: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                   pool: torch.Tensor, n: int, chunk_words: int = CHUNK_WORDS, copy_block: int = COPY_BLOCK) -> None:
    """Claim and copy the experts ``pred [T, k]`` (int, on the device) predict for layer ``target``, on
    the current stream. ``table [L, E]`` int32; ``rows [L*E, nbytes]`` the mapped host store; ``pool
    [S, nbytes]`` the device slots; ``n`` ids considered (at most ``buf.max_claims``)."""
    if rows.shape[1] % 4 or pool.shape[1] != rows.shape[1] or n > buf.max_claims:
        raise ValueError(f"claims copy rows as int32 words between equal rows, at most {buf.max_claims} ids; "
                         f"got rows {tuple(rows.shape)}, pool {tuple(pool.shape)}, {n} ids")
    T, k = pred.shape
    rows32, pool32 = rows.view(torch.int32), pool.view(torch.int32)
    W = rows32.shape[1]
    _claim_kernel[(1,)](pred, table, buf.free, buf.meta, buf.work, buf.done, buf.regions[target], target,
                        T, buf.num_experts, n, buf.max_claims, K=k, BLOCK_N=next_pow2(n))
    _copy_kernel[(COPY_PROGRAMS,)](rows32, pool32, buf.work, buf.done, buf.meta, table, W, cdiv(W, chunk_words),
                                   COPY_PROGRAMS, CHUNK=chunk_words, BLOCK=copy_block, num_warps=8)


def claim_and_copy_ref(buf: ClaimBuffers, target: int, pred: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                       pool: torch.Tensor, n: int, in_flight: list | None = None) -> None:
    """:func:`claim_and_copy` in torch, synchronously: every claimed expert lands at once; with
    ``in_flight`` (a list) its table entry is marked ``CLAIMED`` instead and ``(table, key, slot, rows,
    pool)`` appended for :func:`land_claims`, as when a copy is still under way (the kernels' case
    whenever a layer reads the table before the copy finished)."""
    E, m = buf.num_experts, buf.max_claims
    nxt, count, quota, progress, _, min_votes = buf.meta.tolist()
    if progress >= target - 1:
        quota = 0
    flat = table.view(-1)
    ranked = pred.t().reshape(-1)[:n].tolist()
    votes = {e: ranked.count(e) for e in ranked}
    taken: list[tuple[int, int]] = []
    for e in sorted(dict.fromkeys(ranked), key=lambda e: -votes[e]):     # stable: rank order on ties
        key = target * E + e
        if int(flat[key]) != -1 or votes[e] < min_votes:
            continue
        if len(taken) >= quota or nxt + len(taken) >= count:
            break
        slot = int(buf.free[nxt + len(taken)])
        if in_flight is None:
            pool[slot].copy_(rows[key])
            flat[key] = slot
        else:
            flat[key] = CLAIMED
            in_flight.append((flat, key, slot, rows, pool))
        taken.append((key, slot))
    buf.meta[0] = nxt + len(taken)
    region = buf.regions[target]
    region[0] = len(taken)
    for j, (key, slot) in enumerate(taken):
        region[1 + j], region[1 + m + j], region[1 + 2 * m + j] = key, slot, votes[key - target * E]


def land_claims(in_flight: list) -> None:
    """The copies :func:`claim_and_copy_ref` left under way land: bytes, then the table entry."""
    for flat, key, slot, rows, pool in in_flight:
        pool[slot].copy_(rows[key])
        flat[key] = slot
    in_flight.clear()
