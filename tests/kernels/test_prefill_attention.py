"""Paged prefill attention: the Triton kernel against the engine's reference (``paged_attention_ref``).

Every cache starts filled with NaN and only the rows a sequence owns get values, so a kernel that
reads a row past a context, a padded block-table entry or a wrong block poisons its output. Small
tiles (16 queries x 16 keys) make tiny shapes span several tiles of both kinds.
"""
import math

import pytest
import torch

triton = pytest.importorskip("triton")
from engine.models.layers import SeqSlice, paged_attention_ref  # noqa: E402
from kernels.prefill_attention import PrefillAttentionLaunch, prefill_attention  # noqa: E402
from tests.kernels.test_paged_attention import make_case, make_sinks, quantise  # noqa: E402

# Both sides softmax in float32; fp16 also rounds the probabilities to fp16 before the value product.
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=5e-3)}
SMALL = PrefillAttentionLaunch(block_m=16, block_n=16)


def make_prefill(seqs, heads=4, kv_heads=2, hd=64, block_size=4, dtype=torch.float32, reverse=False, seed=0):
    """A step of sequences ``seqs`` = [(q_len, ctx_len)]: their queries stacked in order (or in reverse
    order of the rows) and a scrambled NaN-padded paged cache holding each one's ctx_len tokens."""
    _, k, v, tables, ctx, bs = make_case([c for _, c in seqs], heads, kv_heads, hd, block_size, dtype, seed=seed)
    q_lens = torch.tensor([n for n, _ in seqs], dtype=torch.int32)
    order = list(range(len(seqs)))[::-1] if reverse else list(range(len(seqs)))
    starts = torch.zeros(len(seqs), dtype=torch.int32)
    row = 0
    for b in order:
        starts[b] = row
        row += int(q_lens[b])
    q = torch.randn(row, heads, hd, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return dict(q=q, k_cache=k, v_cache=v, block_tables=tables, q_starts=starts, q_lens=q_lens, ctx_lens=ctx,
                block_size=bs, max_q_len=int(q_lens.max()), max_ctx_len=int(ctx.max()))


def reference(case, sinks=None, window=0, k_scale=None, v_scale=None):
    """The engine's prefill attention over the same cache -> [T, H, hd]; a quantised cache is gathered
    as the engine's KV cache does it (stored * scale, in the compute dtype)."""
    bs, dtype = case["block_size"], case["q"].dtype
    seqs = [SeqSlice(int(s), int(n), int(c), case["block_tables"][b, :math.ceil(int(c) / bs)].long())
            for b, (s, n, c) in enumerate(zip(case["q_starts"], case["q_lens"], case["ctx_lens"]))]
    k, v = case["k_cache"], case["v_cache"]

    def gather(rows):
        if k_scale is None:
            return k[rows], v[rows]
        return ((k[rows].float() * k_scale[rows][..., None]).to(dtype),
                (v[rows].float() * v_scale[rows][..., None]).to(dtype))
    out = paged_attention_ref(case["q"], gather, seqs, bs, sinks=sinks, window=window)
    return out.view(case["q"].shape)


def check(case, launch=SMALL, sinks=None, window=0, **scales):
    out = prefill_attention(**case, sinks=sinks, window=window, launch=launch, **scales)
    assert out.dtype == case["q"].dtype and out.shape == case["q"].shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(case, sinks, window, **scales), **TOLERANCES[out.dtype])
    return out


WHOLE = [(1, 1), (5, 5), (17, 17), (33, 33)]
CHUNKED = [(3, 20), (16, 16), (1, 9), (7, 30), (20, 37)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_whole_prompts(dtype):
    # q_len == ctx_len: plain causal attention; one token, a partial tile, and prompts over two and
    # three query tiles, with a partial last key block.
    check(make_prefill(WHOLE, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chunked_prefill(dtype):
    # q_len < ctx_len: the chunk's queries sit at ctx_len - q_len onwards and see the earlier chunks'
    # keys; mixed with a whole prompt and a one-token step in one batch.
    check(make_prefill(CHUNKED, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sinks(dtype):
    # A sink per query head joins each row's denominator; GQA, so the sink is the query head's own.
    case = make_prefill(CHUNKED + WHOLE[:2], heads=8, kv_heads=2, dtype=dtype)
    out = check(case, sinks=make_sinks(8))
    assert not torch.allclose(out.float(), reference(case).float(), atol=1e-2)     # the sinks matter


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [1, 3, 8, 16, 29, 36, 37, 100])
def test_window(dtype, window):
    # Windows of one token, inside a key tile, one tile exactly, longer than a query tile, just
    # under, at and past the longest context: whole prompts and chunks longer and shorter than it.
    case = make_prefill([(3, 20), (20, 37), (33, 33), (1, 9)], dtype=dtype)
    out = check(case, window=window)
    if window < 33:
        assert not torch.allclose(out.float(), reference(case).float(), atol=1e-2)  # the window matters


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_window_and_sinks(dtype):
    # A gpt-oss sliding layer: both at once, with the default launch (one 64-query tile).
    case = make_prefill([(40, 40), (9, 50), (1, 12)], heads=8, kv_heads=2, dtype=dtype)
    check(case, launch=None, sinks=make_sinks(8), window=8)


def test_window_reads_no_key_out_of_reach():
    # Each sequence's rows before its first query's window become NaN: a query tile that starts its
    # key loop too early (or a window layer that reads the whole context) poisons the output.
    case = make_prefill([(50, 50), (20, 45), (5, 30)])
    window = 7
    clean = prefill_attention(**case, window=window, launch=SMALL)
    k, v, tables, bs = case["k_cache"].clone(), case["v_cache"].clone(), case["block_tables"], case["block_size"]
    for b, (n, c) in enumerate(zip(case["q_lens"].tolist(), case["ctx_lens"].tolist())):
        pos = torch.arange(max(0, c - n - window + 1))
        rows = tables[b, pos // bs].long() * bs + pos % bs
        k[rows], v[rows] = float("nan"), float("nan")
    poisoned = prefill_attention(**{**case, "k_cache": k, "v_cache": v}, window=window, launch=SMALL)
    assert torch.isfinite(poisoned).all()
    assert torch.equal(poisoned, clean)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_gqa_ratios(kv_heads):
    # Group sizes 1, 2 and 4: head h must read KV head h // (H // Hkv).
    check(make_prefill(CHUNKED, heads=4, kv_heads=kv_heads), sinks=make_sinks(4), window=5)


@pytest.mark.parametrize("block_size, hd", [(3, 64), (6, 40), (16, 64)])
def test_tail_masking(block_size, hd):
    # Block sizes that do not divide a key tile (3, 6) or span one (16), odd lengths, and a head dim
    # below its power-of-two tile (40 in 64).
    case = make_prefill([(13, 13), (7, 31), (2, 17)], block_size=block_size, hd=hd)
    check(case)
    check(case, window=6)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantised_cache(kv_dtype, dtype):
    # int8 / fp8 rows with a float32 scale per token and KV head (the engine's quantised KV cache):
    # dequantised as loaded. Unowned rows hold NaN values and scales.
    case = make_prefill(CHUNKED, dtype=dtype)
    kq, ks = quantise(case["k_cache"].float(), kv_dtype)
    vq, vs = quantise(case["v_cache"].float(), kv_dtype)
    case.update(k_cache=kq, v_cache=vq)
    check(case, sinks=make_sinks(4), window=6, k_scale=ks, v_scale=vs)
    check(case, k_scale=ks, v_scale=vs)


def test_query_rows_in_any_order():
    # q_starts places each sequence's rows; the step need not stack them in batch order.
    check(make_prefill(CHUNKED, reverse=True), sinks=make_sinks(4), window=4)


def test_explicit_scale():
    # A scale other than 1 / sqrt(hd) equals the default on queries scaled by the ratio.
    case = make_prefill(CHUNKED)
    ratio = 0.3 * math.sqrt(64)
    out = prefill_attention(**case, scale=0.3, launch=SMALL)
    torch.testing.assert_close(out, reference({**case, "q": case["q"] * ratio}), **TOLERANCES[torch.float32])


@pytest.mark.parametrize("change, message", [
    (lambda c: dict(k_cache=c["k_cache"].half()), "k_cache must be torch.float32"),
    (lambda c: dict(v_cache=c["v_cache"][:, :, :32]), "v_cache must be"),
    (lambda c: dict(q=c["q"].to(torch.int32)), "q must be bf16/fp16/fp32"),
    (lambda c: dict(q=c["q"][:, :3]), "multiple of KV heads"),
    (lambda c: dict(block_tables=c["block_tables"].long()), "block_tables must be int32"),
    (lambda c: dict(q_lens=c["q_lens"][:1]), "q_lens must be int32 \\[5\\]"),
    (lambda c: dict(ctx_lens=c["ctx_lens"].long()), "ctx_lens must be int32"),
    (lambda c: dict(block_size=7), "whole number of blocks"),
    (lambda c: dict(max_ctx_len=1000), "max_ctx_len"),
    (lambda c: dict(max_q_len=0), "max_q_len"),
    (lambda c: dict(sinks=torch.zeros(2)), "sinks must be"),
    (lambda c: dict(window=-3), "window must be"),
    (lambda c: dict(q=c["q"].transpose(1, 2).contiguous().transpose(1, 2)), "contiguous last dim"),
    (lambda c: dict(launch=PrefillAttentionLaunch(block_m=8)), "block_m=8 must be a power of two"),
    (lambda c: dict(k_cache=c["k_cache"].to(torch.int8), v_cache=c["v_cache"].to(torch.int8)),
     "needs k_scale and v_scale"),
])
def test_launcher_rejects_bad_inputs(change, message):
    # Mistakes a caller can make get one clear sentence, before anything is launched.
    case = make_prefill(CHUNKED)
    with pytest.raises(ValueError, match=message):
        prefill_attention(**{**case, **change(case)})
