"""int4 decode MoE in a single launch: a queue of up tiles, then down tiles, taken in order.

The two-launch decode of :mod:`kernels.moe_decode` pays a launch, a ramp and a tail twice per MoE call;
at one token that fixed cost is as long as reading the int4 weights themselves. Here one launch of a
few programs per SM takes tiles from a queue (an atomic counter), all the up tiles first, then the down
tiles:

* up tile ``(pair, F block)``: the gate and up rows of one expert, SiLU·mul, into ``h`` (as in
  :func:`kernels.moe_decode._up_int4_tile`), then one more up tile counted as done;
* down tile ``(token, D block)``: rows of w2 of each of the token's k experts over all of F. The
  program loads the tile's words, scales and zero points first, then waits until every up tile is
  done, then reads ``h`` and reduces over k in a fixed order (deterministic, no atomics on data).

No deadlock, whatever the grid and however many programs are resident (MPS, other kernels): tiles are
handed out in order, so every up tile taken is held by a program that is running and never waits, and
a program waits only once all up tiles have been taken.

Synchronisation words (int32, one set per device and stream, zero between launches): ``[0]`` queue
head, ``[1]`` up tiles done, ``[2]`` down tiles done. Every program ends by taking one index past the
queue; the one that takes the last (``tiles + programs - 1``) resets ``[0]``. The program finishing
the last down tile resets ``[1]`` and ``[2]``: by then every waiter has passed. Ordering: an up tile's
``h`` stores, a block barrier, then a release increment; a waiter polls with acquire reads (one thread,
then a block barrier) and reads ``h`` from L2 (``.cg``), never from a stale L1 line.

Launches on one stream run one after another, so one set of words per stream suffices; a CUDA graph
keeps the set of the stream it was captured on and must not be replayed on two streams at once.

Legend: T tokens, k experts per token, P = T*k pairs, D hidden, F expert FFN, G int4 group size.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, jit, next_pow2, tl
from kernels.moe_config import TileConfig
from kernels.moe_decode import (_ONE_BITS, _block_k, _down_int4_rows, _down_int4_store, _int4_chunk,
                                _int4_group_dots, _int4_word_args, _up_int4_tile, _x_words)
from kernels.moe_weights import FMT_INT4, PoolMatrix


@jit
def _down_int4_tile_after_up(tok, db, ready_ptr, n_ready, h_ptr, ids_ptr, slot_ptr, tw_ptr, out_ptr, w_ptr,
                             sw_s, sw_n, s_ptr, z_ptr, ss_s, sz_s, ss_n, D, F, F8, stride_o, one,
                             TOP_K: tl.constexpr, KP: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    # One chunk covers F (BLOCK_K >= F): the whole tile is in flight while the program waits for h.
    GW: tl.constexpr = G // 8
    NG: tl.constexpr = BLOCK_K // G
    w_rows, s_rows, z_rows, row_ok, j_ok, h_row = _down_int4_rows(
        tok, db, ids_ptr, slot_ptr, h_ptr, w_ptr, sw_s, sw_n, s_ptr, z_ptr, ss_s, sz_s, ss_n, D, F, TOP_K, KP,
        BLOCK_N)
    grp = tl.arange(0, NG)[:, None, None, None]                         # [NG, 1, 1, 1]
    word = grp * GW + tl.arange(0, GW)[None, None, None, :]             # [NG, 1, 1, GW]
    w, sc, zp, idx, g_in = _int4_chunk(0, w_rows, s_rows, z_rows, row_ok, word, grp, F, G, NG, False)
    # One thread polls (an acquire read, then a block barrier), so waiting programs add one request
    # each per round trip to the counter's L2 line, not one per warp.
    while tl.atomic_add(ready_ptr, 0, sem="acquire") < n_ready:
        pass
    acc = _int4_group_dots(w, h_row, idx, j_ok & g_in, F8, sc, zp, one, 3)  # [KP, BN]
    _down_int4_store(acc, tok, db, tw_ptr, out_ptr, D, stride_o, TOP_K, KP, BLOCK_N)


@jit
def _moe_int4_single_kernel(xv_ptr, ids_ptr, slot_ptr, tw_ptr, h_ptr, out_ptr, sync_ptr,
                            w1_ptr, w1_s, w1_n, s1_ptr, z1_ptr, s1_s, z1_s, s1_n,
                            w2_ptr, w2_s, w2_n, s2_ptr, z2_ptr, s2_s, z2_s, s2_n,
                            T, D, F, F8, stride_x, stride_o, one, TOP_K: tl.constexpr, KP: tl.constexpr,
                            V_KIND: tl.constexpr, G: tl.constexpr, UP_N: tl.constexpr, UP_K: tl.constexpr,
                            UP_EVEN_K: tl.constexpr, DOWN_N: tl.constexpr, DOWN_K: tl.constexpr):
    up_blocks = tl.cdiv(F, UP_N)
    n_up = T * TOP_K * up_blocks
    down_blocks = tl.cdiv(D, DOWN_N)
    n_down = T * down_blocks
    n_tiles = n_up + n_down
    tile = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    while tile < n_tiles:
        if tile < n_up:
            _up_int4_tile(tile // up_blocks, tile % up_blocks, xv_ptr, ids_ptr, slot_ptr, h_ptr, w1_ptr, w1_s,
                          w1_n, s1_ptr, z1_ptr, s1_s, z1_s, s1_n, F, D, stride_x, one, TOP_K, V_KIND, V_KIND, G,
                          UP_N, UP_K, UP_EVEN_K, False)
            tl.debug_barrier()                                          # every thread's h stores first
            tl.atomic_add(sync_ptr + 1, 1, sem="release")
        else:
            d = tile - n_up
            _down_int4_tile_after_up(d // down_blocks, d % down_blocks, sync_ptr + 1, n_up, h_ptr, ids_ptr,
                                     slot_ptr, tw_ptr, out_ptr, w2_ptr, w2_s, w2_n, s2_ptr, z2_ptr, s2_s, z2_s,
                                     s2_n, D, F, F8, stride_o, one, TOP_K, KP, G, DOWN_N, DOWN_K)
            if tl.atomic_add(sync_ptr + 2, 1, sem="relaxed") == n_down - 1:  # the last down tile
                tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed")
                tl.atomic_xchg(sync_ptr + 2, 0, sem="relaxed")
        tile = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    if tile == n_tiles + tl.num_programs(0) - 1:                        # the launch's last index
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")


_SYNC: dict[tuple, torch.Tensor] = {}


def sync_words(device: torch.device) -> torch.Tensor:
    """The zeroed int32 synchronisation words of launches on the current stream of ``device``.

    Kept for the life of the process: a CUDA graph that captured a launch holds their address."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    if key not in _SYNC:
        _SYNC[key] = torch.zeros(4, dtype=torch.int32, device=device)
    return _SYNC[key]


def _programs(device: torch.device, programs_per_sm: int, tiles: int) -> int:
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(tiles, sms * programs_per_sm))


def moe_decode_single(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                      slot_of_expert: torch.Tensor, w13: PoolMatrix, w2: PoolMatrix, fmt: int, group: int,
                      up: TileConfig, down: TileConfig, programs_per_sm: int = 1) -> torch.Tensor:
    """``out [T, D]`` in ``x.dtype`` as :func:`kernels.moe_decode.moe_decode`, in one launch (int4 only).

    ``up.block_n`` / ``up.block_k`` tile the up GEMM; ``down.block_n`` rows of w2 (of every expert of
    a token) make a down tile, read over all of F at once; ``up.num_warps`` / ``up.num_stages`` launch
    the kernel, with ``programs_per_sm`` programs per SM."""
    if fmt != FMT_INT4:
        raise ValueError("the single-launch MoE decode reads int4 experts only; use the 'decode' variant "
                         "for bf16 / fp16 / fp32 / fp8")
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    t, d = x.shape
    k = ids.shape[1]
    f = w13.n // 2
    h = torch.empty(t * k, f, dtype=torch.float32, device=x.device)    # [P, F]: nibble-major
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)            # [T, D]
    xv, stride_x, v_kind = _x_words(x)
    up_k = _block_k(up, FMT_INT4, group, d)
    down_k = max(next_pow2(f), group)                                   # the whole of F in one chunk
    tiles = t * k * cdiv(f, up.block_n) + t * cdiv(d, down.block_n)
    _moe_int4_single_kernel[(_programs(x.device, programs_per_sm, tiles),)](
        xv, ids, slot_of_expert, tw, h, out, sync_words(x.device),
        *_int4_word_args(w13, "w13"), *_int4_word_args(w2, "w2"),
        t, d, f, f // 8, stride_x, out.stride(0), _ONE_BITS, TOP_K=k, KP=next_pow2(k), V_KIND=v_kind, G=group,
        UP_N=up.block_n, UP_K=up_k, UP_EVEN_K=d % up_k == 0, DOWN_N=down.block_n, DOWN_K=down_k,
        num_warps=up.num_warps, num_stages=up.num_stages)
    return out
