"""Paged decode attention: the reference against per-sequence SDPA, the Triton kernel against the reference.

Every cache starts filled with NaN and only the rows a sequence owns get values, so a kernel that reads
a row past a context's end, a padded block-table entry or a wrong block poisons its output. bf16 and
GPU speed are checked by ``benchmarks/kernels/bench_attention.py`` (the interpreter mishandles bf16).
"""
import math

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
from kernels.paged_attention import (DecodeAttentionLaunch, paged_decode_attention,  # noqa: E402
                                     paged_decode_attention_ref)

# Both paths compute in fp32 and differ in summation order; fp16 adds one rounding of the output.
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=5e-3)}


def make_case(lens, heads=4, kv_heads=2, hd=64, block_size=4, dtype=torch.float32, max_blocks=None,
              spare_blocks=3, garbage=float("nan"), seed=0):
    """Random q and a scrambled paged cache holding ``lens`` tokens per sequence; the rest is garbage.

    Block ids are a random permutation of a pool with ``spare_blocks`` unowned blocks; block-table
    entries past a sequence's used blocks point at an unowned block.
    """
    g = torch.Generator().manual_seed(seed)
    used = [math.ceil(n / block_size) for n in lens]
    max_blocks = max_blocks or max(used)
    pool = sum(used) + spare_blocks
    ids = torch.randperm(pool, generator=g)
    k = torch.full((pool * block_size, kv_heads, hd), garbage, dtype=dtype)
    v = torch.full_like(k, garbage)
    tables = torch.full((len(lens), max_blocks), int(ids[-1]), dtype=torch.int32)  # an unowned block
    nxt = 0
    for b, (n, u) in enumerate(zip(lens, used)):
        tables[b, :u] = ids[nxt:nxt + u].to(torch.int32)
        nxt += u
        rows = (tables[b, :u].long()[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        k[rows] = torch.randn(n, kv_heads, hd, generator=g).to(dtype)
        v[rows] = torch.randn(n, kv_heads, hd, generator=g).to(dtype)
    q = torch.randn(len(lens), heads, hd, generator=g).to(dtype)
    return q, k, v, tables, torch.tensor(lens, dtype=torch.int32), block_size


def sdpa_loop(q, k, v, tables, lens, block_size):
    """The truth: gather each sequence's context and call SDPA, one sequence at a time."""
    outs = []
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(n)
        rows = tables[b, pos // block_size].long() * block_size + pos % block_size
        g = q.shape[1] // k.shape[1]
        kb = k[rows].float().repeat_interleave(g, dim=1).transpose(0, 1)     # [H, n, hd]
        vb = v[rows].float().repeat_interleave(g, dim=1).transpose(0, 1)     # [H, n, hd]
        outs.append(F.scaled_dot_product_attention(q[b].float()[:, None], kb, vb)[:, 0])  # [H, hd]
    return torch.stack(outs).to(q.dtype)


def check(case, launch=None, **kw):
    q = case[0]
    out = paged_decode_attention(*case, launch=launch, **kw)
    ref = paged_decode_attention_ref(*case, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **TOLERANCES[q.dtype])
    return out


SMALL = DecodeAttentionLaunch(block_n=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ref_matches_per_sequence_sdpa(dtype):
    # The reference is the engine's CPU path and the kernel's truth: check it against SDPA on the
    # gathered context, with GQA, mixed lengths and garbage everywhere a sequence does not own.
    case = make_case([1, 4, 5, 13], heads=8, kv_heads=2, dtype=dtype, max_blocks=6)
    torch.testing.assert_close(paged_decode_attention_ref(*case), sdpa_loop(*case), **TOLERANCES[dtype])


def test_ref_is_finite_with_huge_garbage():
    # Finite garbage (fp16 max) must be masked as well as NaN: 0 * huge is fine, huge in a max is not.
    case = make_case([3, 9], garbage=65504.0, dtype=torch.float16, max_blocks=4)
    torch.testing.assert_close(paged_decode_attention_ref(*case), sdpa_loop(*case), **TOLERANCES[torch.float16])


def test_one_sequence_long_context():
    # Batch 1 is the case split-KV exists for: many splits over one sequence, then the reduce.
    check(make_case([45], block_size=4), SMALL)


def test_mixed_context_lengths():
    # 1 token, exactly one block, one block + 1, several blocks and a partial tail, in one batch:
    # per-sequence loop bounds and the tail mask inside the last block.
    check(make_case([1, 16, 17, 53], block_size=16, max_blocks=5), SMALL)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_gqa_ratios(kv_heads):
    # Group sizes 1, 2 and 4 (MHA, GQA, MQA-like): head h must read KV head h // (H // Hkv).
    check(make_case([7, 22], heads=4, kv_heads=kv_heads), SMALL)


def test_scrambled_block_ids():
    # Out-of-order, non-contiguous block ids from a large pool: the kernel must follow the table.
    case = make_case([30, 25], block_size=4, spare_blocks=20, seed=3)
    assert not torch.equal(case[3][0, :8].sort().values, case[3][0, :8])   # really scrambled
    check(case, SMALL)


@pytest.mark.parametrize("garbage", [float("nan"), 65504.0])
def test_padded_table_entries_are_never_read(garbage):
    # A table much wider than any context whose spare entries point at a garbage block (NaN or
    # fp16 max): one read of it poisons the output. Also splits that start past a context (empty).
    case = make_case([2, 9], block_size=4, max_blocks=12, garbage=garbage, dtype=torch.float16)
    check(case, DecodeAttentionLaunch(block_n=16, num_splits=12))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hd", [64, 128])
def test_head_dims_and_dtypes(hd, dtype):
    # The model head dims (64: small models, 128: Qwen3) in each dtype the interpreter handles.
    check(make_case([5, 20], heads=4, kv_heads=2, hd=hd, dtype=dtype), SMALL)


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_split_counts_agree(splits):
    # One split writes the output directly; several go through the reduce; uneven splits leave a
    # short last one. All must give the reference's answer.
    check(make_case([19, 40], block_size=4), DecodeAttentionLaunch(block_n=16, num_splits=splits))


@pytest.mark.parametrize("window", [0, 20])
def test_the_last_split_to_arrive_combines_them_as_the_reduce_kernel_does(window):
    # Folded (the default): each (sequence, KV head)'s last split combines the splits the sequence
    # used; its arrival counts are zero again after every call. Sequences of 2, 19 and 61 tokens use
    # 1, 2 and 4 of the 4 splits (with a window of 20, at most 2); sinks and GQA ride along.
    from kernels.arrivals import arrival_counts
    case = make_case([2, 19, 61], heads=8, kv_heads=2, block_size=4)
    kw = dict(sinks=make_sinks(8), window=window)
    folded = check(case, DecodeAttentionLaunch(block_n=16, num_splits=4), **kw)
    apart = check(case, DecodeAttentionLaunch(block_n=16, num_splits=4, fold_reduce=False), **kw)
    torch.testing.assert_close(folded, apart, **TOLERANCES[torch.float32])
    counts = arrival_counts(case[0].device, 6, "paged_attention")
    assert counts.numel() >= 6 and not counts.any()
    check(case, DecodeAttentionLaunch(block_n=16, num_splits=4), **kw)      # the counts were left at zero


@pytest.mark.parametrize("chunk", [4, 2, 1])
@pytest.mark.parametrize("heads,kv_heads,hd", [(8, 2, 16), (6, 2, 20), (4, 4, 16)])
def test_the_combine_takes_every_head_of_a_group_at_once_in_chunks_of_splits(monkeypatch, heads, kv_heads, hd,
                                                                              chunk):
    # The folded combine merges all G heads of a KV head together, `chunk` splits a load, with a running
    # max: sequences using 1, 2, 3 and 4 of the 4 splits, so a chunk of 2 ends half full; G of 3 pads its
    # heads to 4 and a head dim of 20 its rows to 32; G of 1 is plain MHA. It agrees with the combine head
    # after head and with the reference, sinks included.
    import kernels.paged_attention as pa
    g, block_d = heads // kv_heads, pa.next_pow2(max(hd, 16))
    monkeypatch.setattr(pa, "COMBINE_VALUES", chunk * pa.next_pow2(g) * block_d)
    assert pa._combine_chunk(g, block_d, 4) == chunk
    case = make_case([2, 19, 40, 61], heads=heads, kv_heads=kv_heads, hd=hd, block_size=4)
    kw = dict(sinks=make_sinks(heads))
    launch = DecodeAttentionLaunch(block_n=16, num_splits=4)
    grouped = check(case, launch, **kw)
    monkeypatch.setattr(pa, "GROUP_COMBINE", False)
    per_head = check(case, launch, **kw)
    torch.testing.assert_close(grouped, per_head, **TOLERANCES[torch.float32])


def test_odd_block_size_and_block_spanning_steps():
    # A block size that is not a power of two, with loop steps spanning several blocks.
    check(make_case([11, 30], block_size=6), DecodeAttentionLaunch(block_n=32, num_splits=2))


def test_strided_q_out_and_scale():
    # q as a view into a fused qkv projection (batch stride != H * hd), a caller-owned output buffer
    # (a CUDA graph's static output) and an explicit scale.
    q, k, v, tables, lens, bs = make_case([6, 14], heads=4, kv_heads=2)
    qkv = torch.randn(2, 8, 64)
    qkv[:, :4] = q
    out = torch.empty_like(q)
    res = paged_decode_attention(qkv[:, :4], k, v, tables, lens, bs, 0.3, out, launch=SMALL)
    assert res.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, paged_decode_attention_ref(q, k, v, tables, lens, bs, 0.3),
                               **TOLERANCES[torch.float32])


def test_default_launch():
    # The settings the engine uses when it passes none.
    check(make_case([3, 50], block_size=4))


def _bad(case, **change):
    args = dict(zip(["q", "k_cache", "v_cache", "block_tables", "context_lens", "block_size"], case))
    args.update(change)
    return args


@pytest.mark.parametrize("change, message", [
    (lambda c: dict(k_cache=c[1].half()), "k_cache must be torch.float32"),
    (lambda c: dict(v_cache=c[2][:, :, :32]), "v_cache must be"),
    (lambda c: dict(q=c[0].to(torch.int32)), "q must be bf16/fp16/fp32"),
    (lambda c: dict(q=c[0][:, :3]), "multiple of KV heads"),
    (lambda c: dict(block_tables=c[3].long()), "block_tables must be int32"),
    (lambda c: dict(block_tables=c[3][:1]), "block_tables must be int32"),
    (lambda c: dict(context_lens=c[4].long()), "context_lens must be int32"),
    (lambda c: dict(block_size=3), "whole number of blocks"),
    (lambda c: dict(out=torch.empty(2, 4, 32)), "out must be"),
    (lambda c: dict(q=c[0].transpose(1, 2).contiguous().transpose(1, 2)), "contiguous last dim"),
])
def test_launcher_rejects_bad_inputs(change, message):
    # Mistakes a caller can make get one clear sentence, before anything is launched.
    case = make_case([5, 8], heads=4, kv_heads=2, block_size=4)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(**_bad(case, **change(case)))


def quantise(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, Hkv, hd] -> (values in ``dtype``, float32 scales [rows, Hkv]), as the KV cache stores them."""
    qmax = 127.0 if dtype == torch.int8 else 448.0
    scale = (x.abs().amax(-1) / qmax).clamp_min(1e-12)
    y = x / scale[..., None]
    if dtype == torch.int8:
        y = y.round().clamp(-qmax, qmax)
    return y.to(dtype), scale


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [1, 3])
def test_quantised_cache(kv_dtype, dtype, splits):
    # int8 / fp8 rows with one scale per token and KV head (the engine's quantised KV cache): the
    # kernel folds the scales into scores and probabilities; the reference dequantises first.
    # Unowned rows hold NaN values and scales, so a read past a context poisons the output.
    q, k, v, tables, lens, bs = make_case([7, 26], heads=4, kv_heads=2, block_size=4)
    kq, ks = quantise(k, kv_dtype)
    vq, vs = quantise(v, kv_dtype)
    case = (q.to(dtype), kq, vq, tables, lens, bs)
    check(case, DecodeAttentionLaunch(block_n=16, num_splits=splits), k_scale=ks, v_scale=vs)


def test_quantised_cache_needs_both_scales_of_the_right_shape():
    q, k, v, tables, lens, bs = make_case([5, 8], heads=4, kv_heads=2, block_size=4)
    kq, ks = quantise(k, torch.int8)
    vq, vs = quantise(v, torch.int8)
    with pytest.raises(ValueError, match="k_scale and v_scale go together"):
        paged_decode_attention(q, kq, vq, tables, lens, bs, k_scale=ks)
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        paged_decode_attention(q, kq, vq, tables, lens, bs)
    with pytest.raises(ValueError, match="k_scale must be float32"):
        paged_decode_attention(q, kq, vq, tables, lens, bs, k_scale=ks[:, :1], v_scale=vs)


# gpt-oss: sinks (a logit per query head in the softmax denominator) and sliding windows.

def make_sinks(heads, seed=1, spread=1.0):
    return (torch.randn(heads, generator=torch.Generator().manual_seed(seed)) * spread).float()


def test_ref_sinks_and_window_match_explicit_softmax():
    # The reference's extras against the definition written out per sequence: scores of the last
    # `window` positions and the head's sink in one softmax, the sink's share dropped.
    q, k, v, tables, lens, bs = make_case([3, 11], heads=4, kv_heads=2, block_size=4)
    sinks, window = make_sinks(4), 5
    got = paged_decode_attention_ref(q, k, v, tables, lens, bs, sinks=sinks, window=window)
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(max(0, n - window), n)
        rows = tables[b, pos // bs].long() * bs + pos % bs
        kb = k[rows].repeat_interleave(2, dim=1).transpose(0, 1)            # [H, n', hd]
        vb = v[rows].repeat_interleave(2, dim=1).transpose(0, 1)
        scores = (q[b][:, None] @ kb.transpose(1, 2))[:, 0] / math.sqrt(64)   # [H, n']
        probs = torch.softmax(torch.cat([scores, sinks[:, None]], 1), 1)[:, :-1]
        torch.testing.assert_close(got[b], (probs[:, None] @ vb)[:, 0], **TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [1, 4])
def test_sinks(dtype, splits):
    # Sinks join the denominator in the one-split epilogue and in the reduce; GQA so head h's sink
    # must be its own, not its KV head's.
    case = make_case([45, 6, 17], heads=8, kv_heads=2, block_size=4, dtype=dtype)
    out = check(case, DecodeAttentionLaunch(block_n=16, num_splits=splits), sinks=make_sinks(8))
    assert not torch.allclose(out.float(), paged_decode_attention_ref(*case).float(), atol=1e-2)  # sinks matter


@pytest.mark.filterwarnings("ignore:overflow encountered in exp2")   # the interpreter's numpy says so
@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_far_above_the_scores(splits):
    # A sink far above every score takes nearly all the weight (its exp overflows float32: the output
    # must go to 0, not NaN); a sink far below changes nothing.
    case = make_case([30, 9], block_size=4)
    sinks = torch.tensor([100.0, -100.0, 0.0, 120.0])
    out = check(case, DecodeAttentionLaunch(block_n=16, num_splits=splits), sinks=sinks)
    assert out[:, [0, 3]].abs().max() < 1e-6 and out[:, 1].abs().max() > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [1, 3, 4, 9, 16, 44, 45, 200])
def test_window(dtype, window):
    # Windows of one token, within a block, one block exactly, spanning blocks, as long as the longest
    # context minus one, equal to it, and past the whole table; contexts shorter and longer than it.
    case = make_case([45, 2, 17, 4], block_size=4, dtype=dtype)
    out = check(case, DecodeAttentionLaunch(block_n=16), window=window)
    if window < 45:
        assert not torch.allclose(out[0].float(), paged_decode_attention_ref(*case)[0].float(), atol=1e-2)


@pytest.mark.parametrize("splits", [1, 2, 5])
@pytest.mark.parametrize("window", [5, 13])
def test_window_split_counts(window, splits):
    # The splits tile the window's blocks from the block of its first position: one split, several,
    # more splits than the window has blocks (forced), and an odd block size.
    check(make_case([50, 23, 7], block_size=6), DecodeAttentionLaunch(block_n=16, num_splits=splits), window=window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_window_and_sinks(dtype):
    # A gpt-oss sliding layer: both at once, with the default launch.
    case = make_case([60, 3, 33], heads=8, kv_heads=2, block_size=4, dtype=dtype)
    check(case, sinks=make_sinks(8), window=8)


@pytest.mark.parametrize("quantised", [False, True])
@pytest.mark.parametrize("splits", [1, 3])
def test_window_reads_no_block_before_it(splits, quantised):
    # Every cache row a sequence owns before its window becomes NaN (an int8 cache: its scales): one
    # read of any of them (a whole block skipped wrongly, or the window's first block read from its
    # start) poisons the output.
    q, k, v, tables, lens, bs = make_case([45, 21, 3], block_size=4)
    window, launch = 10, DecodeAttentionLaunch(block_n=16, num_splits=splits)
    (k, ks), (v, vs) = (quantise(k, torch.int8), quantise(v, torch.int8)) if quantised else ((k, None), (v, None))
    clean = paged_decode_attention(q, k, v, tables, lens, bs, launch=launch, window=window, k_scale=ks, v_scale=vs)
    poison = [t.clone() for t in ((ks, vs) if quantised else (k, v))]
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(max(0, n - window))
        rows = tables[b, pos // bs].long() * bs + pos % bs
        for t in poison:
            t[rows] = float("nan")
    if quantised:
        ks, vs = poison
    else:
        k, v = poison
    poisoned = paged_decode_attention(q, k, v, tables, lens, bs, launch=launch, window=window, k_scale=ks,
                                      v_scale=vs)
    assert torch.isfinite(poisoned).all()
    assert torch.equal(poisoned, clean)


def test_window_sizes_the_splits_from_the_window():
    # A window layer's split count follows from the window's positions, not from the table width.
    from kernels.paged_attention import split_plan
    launch = DecodeAttentionLaunch()
    full = split_plan(1, 1, 2048, 16, 0, torch.device("cpu"), launch)
    windowed = split_plan(1, 1, 2048, 16, 128, torch.device("cpu"), launch)
    assert windowed == (2, launch.min_split_tokens) and full[0] == 4 * 16     # 4 waves of the interpreter's 16 "SMs"


def test_a_short_context_in_a_long_table_spreads_over_every_split():
    # Each program takes its share of its own sequence's context (read on the device): 40 tokens in a
    # 2048-token table over 12 forced splits run as 3 splits of 16 tokens, 7 tokens as one, and the
    # reduce combines those only (the other splits write nothing).
    case = make_case([40, 7, 33], heads=4, kv_heads=2, block_size=4, max_blocks=512)
    check(case, DecodeAttentionLaunch(block_n=16, num_splits=12))
    check(case, DecodeAttentionLaunch(block_n=16))


@pytest.mark.parametrize("window", [0, 5, 16, 40])
def test_the_reduce_reads_only_the_splits_a_sequence_used(monkeypatch, window):
    # Partial buffers start as NaN: a split that wrote nothing and was read anyway would show.
    import kernels.paged_attention as pa
    made = pa._partials
    monkeypatch.setattr(pa, "_partials", lambda out, splits: tuple(t.fill_(float("nan")) if splits > 1 else t
                                                                    for t in made(out, splits)))
    case = make_case([40, 7, 33, 1], heads=4, kv_heads=2, block_size=4, max_blocks=64)
    for splits in (2, 5, 12):
        check(case, DecodeAttentionLaunch(block_n=16, num_splits=splits), window=window)
    # the default split plan, a least split that is not a multiple of the tile, block sizes 1 and 16,
    # and a context that fills the table
    for bs, lens in ((1, [40, 7, 64]), (16, [48, 1, 33])):
        case = make_case(lens, heads=4, kv_heads=2, block_size=bs, max_blocks=64 // bs)
        for launch in (DecodeAttentionLaunch(block_n=16), DecodeAttentionLaunch(block_n=16, min_split_tokens=24)):
            check(case, launch, window=window)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("splits", [1, 3])
def test_quantised_cache_with_sinks_and_window(kv_dtype, splits):
    # The int8 / fp8 variant takes the same window bounds and sink epilogue; unowned rows are NaN.
    q, k, v, tables, lens, bs = make_case([7, 26, 40], heads=4, kv_heads=2, block_size=4)
    kq, ks = quantise(k, kv_dtype)
    vq, vs = quantise(v, kv_dtype)
    case = (q.to(torch.float16), kq, vq, tables, lens, bs)
    for window in (0, 6):
        check(case, DecodeAttentionLaunch(block_n=16, num_splits=splits), k_scale=ks, v_scale=vs,
              sinks=make_sinks(4), window=window)


@pytest.mark.parametrize("change, message", [
    (dict(sinks=torch.zeros(3)), "sinks must be contiguous float32 \\[4\\]"),
    (dict(sinks=torch.zeros(4, dtype=torch.float16)), "sinks must be"),
    (dict(window=-1), "window must be an int >= 0"),
])
def test_launcher_rejects_bad_sinks_and_window(change, message):
    case = make_case([5, 8], heads=4, kv_heads=2, block_size=4)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(*case, **change)
