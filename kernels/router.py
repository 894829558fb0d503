"""Router: scores over all experts, top-k, optional renormalisation, per-expert activation counts;
and the one-launch tally of a layer call's experts (:func:`tally`).

Semantics (Mixtral, Qwen-MoE, OLMoE): ``softmax`` is taken over all E logits in float32, then the k
largest probabilities are kept; ``sigmoid`` scores each logit independently. ``renormalize`` divides
the k kept weights by their sum. GLM-4.5 adds a per-expert ``bias`` to the scores to choose the k
experts while their weights stay the plain scores, and multiplies the weights by ``scale``
(routed_scaling_factor) after the renormalisation. DeepSeek limits a token's experts to the best
``keep_groups`` of ``groups`` equal groups of consecutive experts: a group is scored by its best score
(softmax, DeepSeek-V2) or by its two best choice scores summed (sigmoid, DeepSeek-V3), and the experts
of the other groups are not chosen.

Tie-breaking: among equal scores the lower expert id ranks first (weights in descending order,
ties by ascending id, as a stable descending sort orders them). On distinct scores this is exactly
``torch.topk``; on exact ties ``torch.topk`` leaves the order unspecified (its CPU kernel returns
tied ids in no fixed order), so the reference uses a stable sort to give both paths one answer.

Legend: T tokens, E experts, k experts per token.
"""
from __future__ import annotations

import torch

from kernels._triton import cdiv, gdc_launch_dependents, gdc_wait, jit, next_pow2, pdl_launch, pdl_supported, tl

SCORINGS = ("softmax", "sigmoid")


@jit
def _keep_best_groups(sel, cols, group_size, GROUPS: tl.constexpr, KEEP: tl.constexpr, TOP2: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr):
    """``sel [BT, BE]`` with the experts outside each row's ``KEEP`` best groups set to -inf (ties: the
    lower group)."""
    gid = cols // group_size                                            # [BE]
    gcols = tl.arange(0, BLOCK_G)
    gscore = tl.full([BLOCK_T, BLOCK_G], -float("inf"), tl.float32)
    for g in tl.static_range(GROUPS):
        v = tl.where((gid == g)[None, :], sel, -float("inf"))           # [BT, BE]
        best = tl.max(v, axis=1)                                        # [BT]
        if TOP2:                                                        # plus the group's second best
            first = tl.min(tl.where(v == best[:, None], cols[None, :], BLOCK_E), axis=1)
            best = best + tl.max(tl.where(cols[None, :] == first[:, None], -float("inf"), v), axis=1)
        gscore = tl.where(gcols[None, :] == g, best[:, None], gscore)
    keep = gid[None, :] < 0                                             # [BT, BE] all False
    for j in tl.static_range(KEEP):
        top = tl.max(gscore, axis=1)
        pick = tl.min(tl.where(gscore == top[:, None], gcols[None, :], BLOCK_G), axis=1)
        keep = keep | (gid[None, :] == pick[:, None])
        gscore = tl.where(gcols[None, :] == pick[:, None], -float("inf"), gscore)
    return tl.where(keep, sel, -float("inf"))


@jit
def _route_block(logits_ptr, bias_ptr, w_ptr, ids_ptr, counts_ptr, acts_ptr, hits_ptr, pad_ptr, rows, T, E, stride_t,
                 scale, group_size, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_E: tl.constexpr, SIGMOID: tl.constexpr, RENORM: tl.constexpr, COUNT: tl.constexpr,
                 BIAS: tl.constexpr, GROUPS: tl.constexpr, KEEP_GROUPS: tl.constexpr, BLOCK_G: tl.constexpr,
                 TALLY: tl.constexpr, PAD: tl.constexpr):
    """Routes the tokens ``rows [BT]`` from their logits (read past L1: the program may be the last of
    several that wrote them) and writes their weights and ids; see :func:`route_ref`. ``PAD``: the
    tally leaves out the rows whose ``pad`` is set."""
    cols = tl.arange(0, BLOCK_E)                                        # [BE]
    kcols = tl.arange(0, BLOCK_K)                                       # [BK]
    row_ok = rows < T
    mask = row_ok[:, None] & (cols[None, :] < E)
    x = tl.load(logits_ptr + rows[:, None] * stride_t + cols[None, :], mask=mask,
                other=-float("inf"), cache_modifier=".cg").to(tl.float32)   # [BT, BE]
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        top = tl.max(x, axis=1)                                         # [BT]
        top = tl.where(row_ok, top, 0.0)                                # rows past T: avoid inf - inf
        ex = tl.exp(x - top[:, None])
        s = ex / tl.where(row_ok, tl.sum(ex, axis=1), 1.0)[:, None]
    if BIAS:                                                            # choose by score + bias
        sel = s + tl.load(bias_ptr + cols, mask=cols < E, other=0.0).to(tl.float32)[None, :]
    else:
        sel = s
    sel = tl.where(mask, sel, -float("inf"))                            # unusable
    if KEEP_GROUPS < GROUPS:
        sel = _keep_best_groups(sel, cols, group_size, GROUPS, KEEP_GROUPS, SIGMOID, BLOCK_T, BLOCK_E, BLOCK_G)
    w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    used = tl.zeros([BLOCK_E], dtype=tl.int32)                          # TALLY: the tokens choosing each expert
    counted = row_ok
    if PAD:
        counted = counted & (tl.load(pad_ptr + rows, mask=row_ok, other=1) == 0)
    for j in tl.static_range(TOP_K):
        best = tl.max(sel, axis=1)                                      # [BT]
        idx = tl.min(tl.where(sel == best[:, None], cols[None, :], BLOCK_E), axis=1)  # lowest id wins
        chosen = cols[None, :] == idx[:, None]                          # [BT, BE]
        weight = tl.sum(tl.where(chosen, s, 0.0), axis=1)               # the plain score
        w = tl.where(kcols[None, :] == j, weight[:, None], w)
        ids = tl.where(kcols[None, :] == j, idx[:, None], ids)
        sel = tl.where(chosen, -float("inf"), sel)
        if TALLY:
            used += tl.sum((chosen & counted[:, None]).to(tl.int32), axis=0)
    if RENORM:
        total = tl.sum(w, axis=1)                                       # [BT]
        w = w / tl.where(row_ok, total, 1.0)[:, None]
    w = w * scale
    out_mask = row_ok[:, None] & (kcols[None, :] < TOP_K)
    offs = rows[:, None] * TOP_K + kcols[None, :]
    tl.store(w_ptr + offs, w, mask=out_mask)
    tl.store(ids_ptr + offs, ids, mask=out_mask)
    if COUNT:
        tl.atomic_add(counts_ptr + ids, tl.full([BLOCK_T, BLOCK_K], 1, tl.int64), mask=out_mask)
    if TALLY:  # the layer call's tally (one program holds every token): tally()'s result, without its launch
        ok = cols < E
        acts = tl.load(acts_ptr + cols, mask=ok, other=0)
        tl.store(acts_ptr + cols, acts + used.to(tl.int64), mask=ok)
        tl.store(hits_ptr, tl.load(hits_ptr) + tl.sum((used > 0).to(tl.int64), axis=0))


@jit
def _route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, counts_ptr, T, E, stride_t, scale, group_size,
                  TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_E: tl.constexpr, SIGMOID: tl.constexpr, RENORM: tl.constexpr,
                  COUNT: tl.constexpr, BIAS: tl.constexpr, GROUPS: tl.constexpr, KEEP_GROUPS: tl.constexpr,
                  BLOCK_G: tl.constexpr, acts_ptr, hits_ptr, pad_ptr, TALLY: tl.constexpr = False,
                  PAD: tl.constexpr = False, PDL: tl.constexpr = False):
    if PDL:  # launched while the router GEMM runs: wait for its logits. No early trigger: the MoE's up
        gdc_wait()  # kernel reads the ids before its own wait, to preload the chosen experts' weights
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)          # [BT]
    _route_block(logits_ptr, bias_ptr, w_ptr, ids_ptr, counts_ptr, acts_ptr, hits_ptr, pad_ptr, rows, T, E, stride_t,
                 scale, group_size, TOP_K, BLOCK_K, BLOCK_T, BLOCK_E, SIGMOID, RENORM, COUNT, BIAS, GROUPS,
                 KEEP_GROUPS, BLOCK_G, TALLY, PAD)


@jit
def _router_gemv_kernel(x_ptr, r_ptr, rbias_ptr, part_ptr, logits_ptr, count_ptr, bias_ptr, w_ptr, ids_ptr, acts_ptr,
                        hits_ptr, pad_ptr, T, E, D, stride_xt, stride_re, scale, group_size, d_per, SPLITS,
                        TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_EP: tl.constexpr, BLOCK_D: tl.constexpr, SIGMOID: tl.constexpr,
                        RENORM: tl.constexpr, BIAS: tl.constexpr, RBIAS: tl.constexpr, GROUPS: tl.constexpr,
                        KEEP_GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, TALLY: tl.constexpr, PAD: tl.constexpr,
                        F32: tl.constexpr, ROUND: tl.constexpr, PDL: tl.constexpr = False):
    """The router's GEMV and the routing in one launch: program ``(i, j)`` makes the partial logits of
    experts ``i * BLOCK_EP ..`` over columns ``j * d_per ..`` for every token into ``part [SPLITS, BT, E]``;
    the last to finish adds the splits in their order (the same sums whichever program is last),
    then routes the tokens."""
    if PDL:  # no early trigger: the MoE's up kernel reads the ids before its own wait
        gdc_wait()
    e = tl.program_id(0) * BLOCK_EP + tl.arange(0, BLOCK_EP)           # [BEP]
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_T)                                        # [BT]
    d = tl.arange(0, BLOCK_D)                                           # [BD]
    acc = tl.zeros([BLOCK_T, BLOCK_EP], dtype=tl.float32)
    lo = split * d_per
    for d0 in range(lo, lo + d_per, BLOCK_D):
        d_ok = (d0 + d < D) & (d0 + d < lo + d_per)
        xd = tl.load(x_ptr + rows[:, None] * stride_xt + d0 + d[None, :], mask=(rows < T)[:, None] & d_ok[None, :],
                     other=0.0)                                         # [BT, BD]
        rd = tl.load(r_ptr + e[:, None] * stride_re + d0 + d[None, :], mask=(e < E)[:, None] & d_ok[None, :],
                     other=0.0)                                         # [BEP, BD]
        if F32:  # a float32 router (or the interpreter): IEEE products
            acc += tl.dot(xd.to(tl.float32), tl.trans(rd.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(xd, tl.trans(rd.to(xd.dtype)))
    ok = (rows < T)[:, None] & (e < E)[None, :]
    tl.store(part_ptr + (split * BLOCK_T + rows[:, None]) * E + e[None, :], acc, mask=ok)
    tl.debug_barrier()                                                  # every thread's partials stored
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel")               # releases them, acquires the others'
    if arrived == tl.num_programs(0) * tl.num_programs(1) - 1:
        tl.atomic_xchg(count_ptr, 0)                                    # zero again for the next call
        cols = tl.arange(0, BLOCK_E)                                    # [BE]
        full = (rows < T)[:, None] & (cols < E)[None, :]
        tile = rows[:, None] * E + cols[None, :]
        lg = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
        for j in range(0, SPLITS):                                      # in order: the same sums every call
            lg += tl.load(part_ptr + j * BLOCK_T * E + tile, mask=full, other=0.0, cache_modifier=".cg")
        if ROUND:  # the logits in the activations' dtype, as the unfused GEMM leaves them
            lg = lg.to(x_ptr.dtype.element_ty).to(tl.float32)
        if RBIAS:
            lg += tl.load(rbias_ptr + cols, mask=cols < E, other=0.0).to(tl.float32)[None, :]
            if ROUND:
                lg = lg.to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(logits_ptr + tile, lg, mask=full)
        tl.debug_barrier()                                              # the routing reads other threads' logits
        _route_block(logits_ptr, bias_ptr, w_ptr, ids_ptr, ids_ptr, acts_ptr, hits_ptr, pad_ptr, rows, T, E, E,
                     scale, group_size, TOP_K, BLOCK_K, BLOCK_T, BLOCK_E, SIGMOID, RENORM, False, BIAS, GROUPS,
                     KEEP_GROUPS, BLOCK_G, TALLY, PAD)


@jit
def _tally_kernel(ids_ptr, acts_ptr, hits_ptr, pad_ptr, N, E, K, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                  PAD: tl.constexpr = False, PDL: tl.constexpr = False):
    """One program: ``acts[e] += #(ids == e)``, ``hits[0] += #distinct ids``; ``PAD``: leaving out the
    ids of the rows (``K`` ids each) whose ``pad`` is set."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    cols = tl.arange(0, BLOCK_E)                                        # [BE]
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, N, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)                            # [BN]
        ok = offs < N
        if PAD:
            ok = ok & (tl.load(pad_ptr + offs // K, mask=ok, other=1) == 0)
        ids = tl.load(ids_ptr + offs, mask=ok, other=-1)
        counts += tl.sum((ids[:, None] == cols[None, :]).to(tl.int32), axis=0)
    ok = cols < E
    acts = tl.load(acts_ptr + cols, mask=ok, other=0)
    tl.store(acts_ptr + cols, acts + counts.to(tl.int64), mask=ok)
    distinct = tl.sum((counts > 0).to(tl.int64), axis=0)
    tl.store(hits_ptr, tl.load(hits_ptr) + distinct)


def tally(ids: torch.Tensor, acts: torch.Tensor, hits: torch.Tensor, pad: torch.Tensor | None = None) -> None:
    """Count one layer call in a single launch (no sync, graph-capturable): ``acts [E] int64`` gains
    how many of ``ids`` (any shape, integer) chose each expert, ``hits [1] int64`` the number of
    distinct experts among them. ``pad [T] bool``, if given, leaves out the rows of ``ids [T, k]``
    where it is set (the padding rows of a replayed step). Same result as :func:`tally_ref`."""
    _check_tally(ids, acts, hits, pad)
    n, e = ids.numel(), acts.shape[0]
    block_e = next_pow2(e)
    block_n = max(1, min(next_pow2(max(n, 1)), 8192 // block_e))
    pdl = pdl_supported(ids.device)
    k = ids.shape[-1] if ids.dim() > 1 else 1
    _tally_kernel[(1,)](ids.reshape(-1), acts, hits, pad if pad is not None else acts, n, e, k, BLOCK_N=block_n,
                        BLOCK_E=block_e, PAD=pad is not None, PDL=pdl, num_warps=8 if n >= 1024 else 4,
                        **pdl_launch(pdl))   # a prefill's thousands of ids: more threads on the one program


def tally_ref(ids: torch.Tensor, acts: torch.Tensor, hits: torch.Tensor, pad: torch.Tensor | None = None) -> None:
    """Plain-torch :func:`tally`."""
    _check_tally(ids, acts, hits, pad)
    if pad is not None:
        ids = ids[~pad]
    delta = torch.bincount(ids.reshape(-1).to(torch.int64), minlength=acts.shape[0])   # [E]
    acts += delta
    hits += (delta > 0).sum()


def _check_tally(ids: torch.Tensor, acts: torch.Tensor, hits: torch.Tensor, pad: torch.Tensor | None = None) -> None:
    """``ids``: the call's ids, or an empty stand-in of their dtype and device (``pad`` unchecked)."""
    if ids.is_floating_point() or acts.dim() != 1 or acts.dtype != torch.int64 or hits.shape != (1,) \
            or hits.dtype != torch.int64 or not acts.is_contiguous() or len({ids.device, acts.device, hits.device}) != 1:
        raise ValueError(f"tally takes integer ids and int64 acts [E] and hits [1] on one device, got ids "
                         f"{ids.dtype}, acts {acts.dtype} {tuple(acts.shape)}, hits {hits.dtype} {tuple(hits.shape)}")
    rows_differ = ids.numel() > 0 and (ids.dim() != 2 or ids.shape[:1] != pad.shape) if pad is not None else False
    if pad is not None and (pad.dtype != torch.bool or pad.dim() != 1 or not pad.is_contiguous()
                            or pad.device != acts.device or rows_differ):
        raise ValueError(f"a tally's pad must be one contiguous bool per row of the ids on their device, got "
                         f"{pad.dtype} {tuple(pad.shape)} on {pad.device} for ids [T, k] {tuple(ids.shape)}")


def _tally_parts(tally_into: tuple | None, t: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor | None]:
    """``(acts, hits, pad or None)`` of a router's ``tally_into`` (``(acts, hits)`` or ``(acts, hits, pad [t])``),
    checked; ``ids`` stands in where there is none."""
    if tally_into is None:
        return ids, ids, None
    if len(tally_into) not in (2, 3):
        raise ValueError(f"tally_into is (acts, hits) or (acts, hits, pad), got {len(tally_into)} items")
    acts, hits, pad = (tuple(tally_into) + (None,))[:3]
    _check_tally(ids.new_empty(0), acts, hits, pad)
    if pad is not None and pad.shape != (t,):
        raise ValueError(f"a tally's pad must have one entry per token ({t}), got {tuple(pad.shape)}")
    return acts, hits, pad


def _check(logits: torch.Tensor, top_k: int, scoring: str, counts: torch.Tensor | None,
           bias: torch.Tensor | None = None, groups: int = 1, keep_groups: int = 1) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"router logits must be a float matrix [T, E], got {logits.dtype} {tuple(logits.shape)}")
    e = logits.shape[1]
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k={top_k} must lie between 1 and the number of experts {e}")
    if groups < 1 or e % groups or not 1 <= keep_groups <= groups or keep_groups * (e // groups) < top_k \
            or (scoring == "sigmoid" and keep_groups < groups and e // groups < 2):
        raise ValueError(f"expert groups: {groups} groups of the {e} experts, {keep_groups} kept, do not leave "
                         f"{top_k} experts to choose (sigmoid scores need groups of two or more)")
    if scoring not in SCORINGS:
        raise ValueError(f"router scoring {scoring!r} is not supported; choose softmax or sigmoid")
    if counts is not None and (counts.shape != (e,) or counts.dtype != torch.int64
                               or counts.device != logits.device):
        raise ValueError(f"counts must be int64 [{e}] on {logits.device}, got {counts.dtype} "
                         f"{tuple(counts.shape)} on {counts.device}")
    if bias is not None and (bias.shape != (e,) or bias.dtype != torch.float32 or bias.device != logits.device):
        raise ValueError(f"bias must be float32 [{e}] on {logits.device}, got {bias.dtype} {tuple(bias.shape)} "
                         f"on {bias.device}")


def _keep_best_groups_ref(choice: torch.Tensor, groups: int, keep: int, top2: bool) -> torch.Tensor:
    """``choice [T, E]`` with the experts outside each row's ``keep`` best groups set to -inf."""
    t, e = choice.shape
    g = choice.view(t, groups, e // groups)
    score = g.topk(2, dim=-1).values.sum(-1) if top2 else g.amax(-1)   # [T, G]
    best = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :keep]   # ties: the lower group
    kept = torch.zeros_like(score, dtype=torch.bool).scatter_(1, best, True)
    return choice.masked_fill(~kept.repeat_interleave(e // groups, 1), float("-inf"))


def route_ref(logits: torch.Tensor, top_k: int, scoring: str = "softmax", renormalize: bool = False,
              counts: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              scale: float = 1.0, groups: int = 1, keep_groups: int = 1,
              tally_into: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch router. ``logits [T, E]`` -> ``(weights [T, k] float32, ids [T, k] int32)``.

    ``counts [E] int64``, if given, is incremented by how many tokens chose each expert. ``bias [E]``
    float32, if given, is added to the scores to choose the experts (not to their weights); the
    weights are multiplied by ``scale`` last. ``groups`` / ``keep_groups``: the experts are chosen
    within each token's best ``keep_groups`` of ``groups`` groups (see the module docstring).
    ``tally_into`` ``(acts [E], hits [1])`` int64, if given, counts the call as :func:`tally` does (a
    third item, ``pad [T]`` bool, leaves out the padding rows of a replayed step).
    """
    _check(logits, top_k, scoring, counts, bias, groups, keep_groups)
    x = logits.float()                                                  # [T, E]
    scores = torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)
    choice = scores if bias is None else scores + bias
    if keep_groups < groups:
        choice = _keep_best_groups_ref(choice, groups, keep_groups, scoring == "sigmoid")
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]   # [T, k] ties: lower id
    w = scores.gather(1, ids)                                           # [T, k]
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    w = w * scale
    if counts is not None:
        counts.index_add_(0, ids.flatten(), torch.ones_like(ids.flatten(), dtype=torch.int64))
    if tally_into is not None:
        tally_ref(ids, *tally_into)
    return w, ids.to(torch.int32)


def route(logits: torch.Tensor, top_k: int, scoring: str = "softmax", renormalize: bool = False,
          counts: torch.Tensor | None = None, bias: torch.Tensor | None = None,
          scale: float = 1.0, groups: int = 1, keep_groups: int = 1,
          tally_into: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton router, same contract as :func:`route_ref`; one program per ``BLOCK_T`` tokens.

    Needs no host sync, so it can be captured in a CUDA graph. ``tally_into`` is counted in the same
    launch where one program holds every token (a decode step's), else by :func:`tally` after it.
    """
    _check(logits, top_k, scoring, counts, bias, groups, keep_groups)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    t, e = logits.shape
    w = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    acts, hits, pad = _tally_parts(tally_into, t, ids)
    if t == 0:
        return w, ids
    block_e = next_pow2(e)
    block_t = max(1, min(16, 4096 // block_e, next_pow2(t)))
    programs = cdiv(t, block_t)
    folded = tally_into is not None and programs == 1
    pdl = pdl_supported(logits.device)        # the launch overlaps the end of the router GEMM (Hopper+)
    _route_kernel[(programs,)](
        logits, bias if bias is not None else logits, w, ids, counts if counts is not None else ids, t, e,
        logits.stride(0), float(scale), e // groups, TOP_K=top_k, BLOCK_K=next_pow2(top_k), BLOCK_T=block_t,
        BLOCK_E=block_e, SIGMOID=scoring == "sigmoid", RENORM=renormalize, COUNT=counts is not None,
        BIAS=bias is not None, GROUPS=groups, KEEP_GROUPS=keep_groups, BLOCK_G=next_pow2(groups),
        acts_ptr=acts, hits_ptr=hits, pad_ptr=pad if pad is not None else ids, TALLY=folded, PAD=pad is not None,
        PDL=pdl, **pdl_launch(pdl))
    if tally_into is not None and not folded:
        tally(ids, acts, hits, pad)
    return w, ids


GEMV_MAX_TOKENS = 16           # steps the fused router takes: one program block of tokens
GEMV_MAX_EXPERTS = 256         # ... and its routing's [tokens, experts] tile
GEMV_EXPERTS = 16             # experts per program of the fused router (tl.dot's smallest tile side)
GEMV_PROGRAMS = 64             # about how many programs read the router: its columns split among them
# Whether decode steps take route_gemv. Off: the GEMM and the routing as two launches were faster on the
# H100, first with the fused kernel's 8 programs reading the router on 8 SMs (step_profile int4 875
# against 829 tok/s, benchmarks/results/validate_2026-12-06b.json), then with its columns split among
# about GEMV_PROGRAMS programs (int4/fp8 879 against 760, validate_2026-12-06d.json: the same GPU busy
# time, a longer step). On: the benchmarks' A/B.
FUSED_GEMV = False


def route_gemv_fits(x: torch.Tensor, router: torch.Tensor) -> bool:
    """Whether :func:`route_gemv` takes this call: a decode step's few tokens, a router of up to
    ``GEMV_MAX_EXPERTS`` experts in ``x``'s dtype or float32, contiguous rows."""
    return (x.dim() == 2 and router.dim() == 2 and 0 < x.shape[0] <= GEMV_MAX_TOKENS
            and router.shape[0] <= GEMV_MAX_EXPERTS and x.shape[1] == router.shape[1]
            and router.dtype in (x.dtype, torch.float32) and x.stride(1) == 1 and router.stride(1) == 1
            and x.device == router.device)


def route_gemv(x: torch.Tensor, router: torch.Tensor, top_k: int, scoring: str = "softmax",
               renormalize: bool = False, router_bias: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               scale: float = 1.0, groups: int = 1, keep_groups: int = 1,
               tally_into: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's logits of ``x [T, D]`` (``router [E, D]``, plus ``router_bias [E]``) and :func:`route`
    of them in one launch: programs of 16 experts and a share of the columns each make partial logits,
    and the last to finish adds them up and routes the tokens. The logits are those of engine/models/moe_transformer.router_logits: in float32 for a
    float32 router, else rounded to ``x``'s dtype (the bias added in it), as the separate GEMM leaves them.
    Takes what :func:`route_gemv_fits` says; graph-capturable."""
    if not route_gemv_fits(x, router):
        raise ValueError(f"route_gemv takes up to {GEMV_MAX_TOKENS} tokens and {GEMV_MAX_EXPERTS} experts with a "
                         f"router in x's dtype or float32; got x {x.dtype} {tuple(x.shape)}, router {router.dtype} "
                         f"{tuple(router.shape)}")
    from kernels.arrivals import arrival_counts
    t, d = x.shape
    e = router.shape[0]
    logits = torch.empty(t, e, dtype=torch.float32, device=x.device)
    _check(logits, top_k, scoring, None, bias, groups, keep_groups)
    if router_bias is not None and (router_bias.shape != (e,) or router_bias.device != x.device):
        raise ValueError(f"router_bias must be [{e}] on {x.device}, got {tuple(router_bias.shape)} on "
                         f"{router_bias.device}")
    w = torch.empty(t, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=x.device)
    acts, hits, pad = _tally_parts(tally_into, t, ids)
    f32 = router.dtype == torch.float32 or x.dtype == torch.float32 or x.device.type != "cuda"
    per, block_d = GEMV_EXPERTS, min(256, max(16, next_pow2(d)))
    blocks = cdiv(e, per)
    chunks = cdiv(d, block_d)
    splits = cdiv(chunks, cdiv(chunks * blocks, GEMV_PROGRAMS))         # about GEMV_PROGRAMS programs
    d_per = cdiv(chunks, splits) * block_d
    splits = cdiv(d, d_per)
    part = torch.empty(splits, GEMV_MAX_TOKENS, e, dtype=torch.float32, device=x.device)
    pdl = pdl_supported(x.device)
    _router_gemv_kernel[(blocks, splits)](
        x, router, router_bias if router_bias is not None else router, part, logits,
        arrival_counts(x.device, 1, "router"), bias if bias is not None else logits, w, ids, acts, hits,
        pad if pad is not None else ids, t, e, d,
        x.stride(0), router.stride(0), float(scale), e // groups, d_per, splits, TOP_K=top_k,
        BLOCK_K=next_pow2(top_k), BLOCK_T=GEMV_MAX_TOKENS, BLOCK_E=next_pow2(e), BLOCK_EP=per, BLOCK_D=block_d,
        SIGMOID=scoring == "sigmoid", RENORM=renormalize, BIAS=bias is not None, RBIAS=router_bias is not None,
        GROUPS=groups, KEEP_GROUPS=keep_groups, BLOCK_G=next_pow2(groups), TALLY=tally_into is not None,
        PAD=pad is not None, F32=f32,
        ROUND=router.dtype != torch.float32 and x.dtype != torch.float32, PDL=pdl, num_warps=4,
        **pdl_launch(pdl))
    return w, ids
