"""Latent-attention decode: the Triton kernel (interpreter) against the plain-torch truth and against the
engine's own torch path (engine/models/mla.py), over scrambled paged caches whose unowned rows are NaN,
for float32 and float16 queries, int8 and fp8 rows with scales, one split and several, head counts that
do not fill a block of heads. bf16 and GPU speed are the GPU tests' and the benchmarks' (the interpreter
mishandles bf16)."""
import math

import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.latent_attention import (LatentDecodeLaunch, latent_decode_attention,  # noqa: E402
                                      latent_decode_attention_ref)

TOLERANCES = {torch.float32: dict(atol=3e-5, rtol=3e-5), torch.float16: dict(atol=4e-3, rtol=1e-2)}


def make_case(lens, heads=5, r=32, p=16, block_size=4, dtype=torch.float32, spare_blocks=3, seed=0):
    """q [B, H, r + p] and a latent cache of scrambled blocks holding ``lens`` tokens; the rest is NaN."""
    g = torch.Generator().manual_seed(seed)
    used = [math.ceil(n / block_size) for n in lens]
    pool = sum(used) + spare_blocks
    ids = torch.randperm(pool, generator=g)
    c = torch.full((pool * block_size, 1, r), float("nan"), dtype=dtype)
    kp = torch.full((pool * block_size, 1, p), float("nan"), dtype=dtype)
    tables = torch.full((len(lens), max(used)), int(ids[-1]), dtype=torch.int32)
    nxt = 0
    for b, (n, u) in enumerate(zip(lens, used)):
        tables[b, :u] = ids[nxt:nxt + u].to(torch.int32)
        nxt += u
        rows = (tables[b, :u].long()[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        c[rows] = torch.randn(n, 1, r, generator=g).to(dtype)
        kp[rows] = torch.randn(n, 1, p, generator=g).to(dtype)
    q = (torch.randn(len(lens), heads, r + p, generator=g) * 0.5).to(dtype)
    return q, c, kp, tables, torch.tensor(lens, dtype=torch.int32), block_size


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("heads", [5, 20])
def test_the_kernel_matches_the_reference(dtype, splits, heads):
    q, c, kp, tables, lens, bs = make_case([1, 7, 30, 13], heads=heads, dtype=dtype)
    scale = 0.3
    want = latent_decode_attention_ref(q, c, kp, tables, lens, bs, scale)
    got = latent_decode_attention(q, c, kp, tables, lens, bs, scale, launch=LatentDecodeLaunch(num_splits=splits))
    assert got.shape == (4, heads, 32) and got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **TOLERANCES[dtype])


def test_splits_past_a_short_context_write_nothing_the_reduce_reads(monkeypatch):
    # Each split takes its share of its own sequence's context; partial buffers start as NaN, so a
    # split that wrote nothing and was combined anyway would show.
    import kernels.latent_attention as la
    made = la._partials
    monkeypatch.setattr(la, "_partials", lambda out, splits: tuple(t.fill_(float("nan")) if splits > 1 else t
                                                                    for t in made(out, splits)))
    for seed, bs in ((0, 4), (1, 1), (2, 16)):
        q, c, kp, tables, lens, bs = make_case([1, 7, 30, 13], heads=5, block_size=bs, seed=seed)
        wide = torch.cat([tables, tables[:, -1:].expand(-1, 40)], dim=1)   # a table much wider than the contexts
        want = latent_decode_attention_ref(q, c, kp, wide, lens, bs, 0.3)
        assert torch.isfinite(want).all()           # the reference masks padding (row 0 may hold NaN)
        for launch in (LatentDecodeLaunch(num_splits=2), LatentDecodeLaunch(num_splits=9), LatentDecodeLaunch()):
            got = latent_decode_attention(q, c, kp, wide, lens, bs, 0.3, launch=launch)
            torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("storage", [torch.int8, torch.float8_e4m3fn])
def test_int8_and_fp8_rows_with_their_scales(storage):
    from engine.kv.cache import KVCache
    q, c, kp, tables, lens, bs = make_case([9, 22], heads=3)
    cache = KVCache(1, c.shape[0] // bs, bs, 1, 32, torch.float32, torch.device("cpu"),
                    "int8" if storage == torch.int8 else "fp8", v_head_dim=16)
    live = torch.isfinite(c[:, 0, 0]).nonzero()[:, 0]
    cache.write(0, live, c[live], kp[live])
    want = latent_decode_attention_ref(q, cache.k[0], cache.v[0], tables, lens, bs, 0.25, c_scale=cache.k_scale[0],
                                       p_scale=cache.v_scale[0])
    got = latent_decode_attention(q, cache.k[0], cache.v[0], tables, lens, bs, 0.25, c_scale=cache.k_scale[0],
                                  p_scale=cache.v_scale[0], launch=LatentDecodeLaunch(num_splits=2))
    torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])
    exact = latent_decode_attention_ref(q, c, kp, tables, lens, bs, 0.25)        # before the 8-bit rounding
    assert (got - exact).abs().max() < 0.1


def test_the_kernel_agrees_with_the_engines_torch_path():
    from engine.kv.cache import KVCache
    from engine.models.mla import _decode
    from kernels.paged_attention import context_rows
    q, c, kp, tables, lens, bs = make_case([5, 17, 3], heads=4)
    cache = KVCache(1, c.shape[0] // bs, bs, 1, 32, torch.float32, torch.device("cpu"), v_head_dim=16)
    live = torch.isfinite(c[:, 0, 0]).nonzero()[:, 0]
    cache.write(0, live, c[live], kp[live])
    rows, valid = context_rows(tables, lens, bs)
    want = _decode(q, cache, 0, rows, valid, 32, 0.2)
    got = latent_decode_attention(q, cache.k[0], cache.v[0], tables, lens, bs, 0.2)
    torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])


def test_bad_arguments_are_one_sentence():
    q, c, kp, tables, lens, bs = make_case([3], heads=2)
    with pytest.raises(ValueError, match="q's last dim"):
        latent_decode_attention(q[..., :40], c, kp, tables, lens, bs)
    with pytest.raises(ValueError, match="c_scale and p_scale go together"):
        latent_decode_attention(q, c.to(torch.int8), kp.to(torch.int8), tables, lens, bs,
                                c_scale=torch.ones(c.shape[:2]))
    with pytest.raises(ValueError, match="block_h=8 must be a power of two >= 16"):
        latent_decode_attention(q, c, kp, tables, lens, bs, launch=LatentDecodeLaunch(block_h=8))
