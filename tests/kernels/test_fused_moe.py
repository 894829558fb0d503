"""Triton fused MoE (decode and prefill variants) against ``fused_moe_ref``, per format and dtype.

Every pool has spare slots full of random bytes and a permuted slot table, so a kernel that reads a
wrong slot, a wrong stride or a gathered copy fails. bf16 activations and GPU speed are checked by
``benchmarks/kernels/bench_moe.py`` on the GPU (the interpreter mishandles bf16 arithmetic).
"""
import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.fused_moe import fused_moe, fused_moe_ref  # noqa: E402
from kernels.expert_layout import ExpertLayout  # noqa: E402
from kernels.quant import quantize_expert  # noqa: E402
from kernels.moe_config import MoeLaunchConfig, TileConfig  # noqa: E402
from kernels.moe_weights import HostExperts  # noqa: E402
from kernels.moe_decode_common import SLOT_CPU  # noqa: E402
from kernels._triton import jit, tl  # noqa: E402
from kernels.act16 import act16, act16_ref, store_h_words  # noqa: E402
from tests.kernels.helpers import TOLERANCES, make_pool, make_routing, tolerance  # noqa: E402

DECODE = MoeLaunchConfig("decode", TileConfig(16, 32), TileConfig(16, 32))
PREFILL = MoeLaunchConfig("prefill", TileConfig(16, 32), TileConfig(16, 32), block_m=16)
SPLIT_GROUPS = MoeLaunchConfig("decode", TileConfig(16, 64), TileConfig(16, 64))  # int4: 2 groups a step
ONE_SHOT = MoeLaunchConfig("decode", TileConfig(4, 1024), TileConfig(1, 1024))    # one chunk per row
WIDE_TILES = MoeLaunchConfig("decode", TileConfig(64, 128), TileConfig(64, 128))  # int4: 4 groups a tile


def run_case(fmt, dtype, hidden, ffn, experts, tokens, top_k, cfg, group=32, used=None):
    layout, _, views, slots = make_pool(fmt, hidden, ffn, experts, group)
    ids, weights = make_routing(tokens, experts, top_k, used)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = fused_moe(x, ids, weights, slots, views, layout, cfg)
    ref = fused_moe_ref(x, ids, weights, slots, views, layout)
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    torch.testing.assert_close(out, ref, **tolerance(fmt, dtype))
    return out


@pytest.mark.parametrize("cfg", [DECODE, PREFILL], ids=["decode", "prefill"])
@pytest.mark.parametrize("fmt, dtype", [("fp32", torch.float32), ("fp16", torch.float16),
                                        ("fp8", torch.float32), ("fp8", torch.float16)])
def test_dense_and_fp8_odd_tails(cfg, fmt, dtype):
    # Odd K and N (37, 19) leave partial tiles in both GEMMs; 3 tokens is fewer than the block.
    run_case(fmt, dtype, hidden=37, ffn=19, experts=6, tokens=3, top_k=2, cfg=cfg)


@pytest.mark.parametrize("cfg", [DECODE, PREFILL], ids=["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_group_sizes(cfg, dtype, group):
    # Each supported group size: the kernel must pick the right scale and zero for every nibble.
    run_case("int4", dtype, hidden=128, ffn=128 if group == 128 else 64, experts=4, tokens=2,
             top_k=2, cfg=cfg, group=group)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int4_several_groups_per_step_with_tail(dtype):
    # Decode K chunks spanning two groups, where K (96 in both GEMMs) leaves half a chunk: the group
    # mask matters in the up and in the down kernel, and each group's zero point comes out of its sum.
    run_case("int4", dtype, hidden=96, ffn=96, experts=3, tokens=1, top_k=2, cfg=SPLIT_GROUPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int4_tiles_of_several_groups_with_n_and_k_tails(dtype):
    # K tiles of 4 groups (128 of G = 32): group boundaries inside every tile, K = 160 ends mid-tile
    # (the group mask and the pair mask), and 64-row tiles over F = 96 and D = 160 leave N tails in
    # both kernels; x's group sums (5 of them) are read past the tile's last whole group.
    run_case("int4", dtype, hidden=160, ffn=96, experts=5, tokens=3, top_k=3, cfg=WIDE_TILES)


def test_int4_word_tiles_with_a_lone_tail_group():
    # K = 224 is 7 groups of 32 (28 int32 words a row): 64-element chunks end on one lone group in both
    # kernels, and h is stored as planes of 28 words each, not a power of two.
    cfg = MoeLaunchConfig("decode", TileConfig(32, 64), TileConfig(32, 64))
    run_case("int4", torch.float16, hidden=224, ffn=224, experts=4, tokens=1, top_k=2, cfg=cfg)


@pytest.mark.parametrize("preload", [(2, 3), (2, 2), (3, 5)])
def test_int4_chunks_read_before_the_wait(preload):
    # Launch settings may read up to 2 (up) and 3 (down) K chunks before the kernels wait for their
    # predecessor; 5 K chunks (hidden 160, ffn 160, chunks of 32) leave the rest to the K loop, and a
    # setting asking for more than a kernel holds is clamped.
    up, down = preload
    cfg = MoeLaunchConfig("decode", TileConfig(16, 32, preload=up), TileConfig(16, 32, preload=down))
    run_case("int4", torch.float32, hidden=160, ffn=160, experts=4, tokens=1, top_k=2, cfg=cfg)


def test_int4_rejects_weights_off_16_byte_rows():
    # The int4 kernels read packed rows as int32 words in 16-byte loads; a pool view that does not
    # start on such a boundary (not placed by ExpertLayout) is refused with a sentence, not misread.
    layout, buf, _, slots = make_pool("int4", 64, 32, 4)
    shifted = torch.zeros(buf.shape[0], buf.shape[1] + 16, dtype=torch.uint8)
    shifted[:, 4:4 + buf.shape[1]] = buf
    views = layout.views(shifted[:, 4:4 + buf.shape[1]])
    ids, w = make_routing(1, 4, 2)
    with pytest.raises(ValueError, match="16-byte boundaries"):
        fused_moe(torch.randn(1, 64), ids, w, slots, views, layout, ONE_SHOT)


def test_int4_bf16_activations():
    # bf16 rows are read as int32 pairs and widened by bit moves (no bf16 arithmetic, so the
    # interpreter runs it); compared with float32 math on the same bf16 inputs.
    layout, _, views, slots = make_pool("int4", 160, 96, 5)
    ids, w = make_routing(3, 5, 3)
    x = torch.randn(3, 160, generator=torch.Generator().manual_seed(7)).bfloat16()
    out = fused_moe(x, ids, w, slots, views, layout, WIDE_TILES)
    ref = fused_moe_ref(x.float(), ids, w, slots, views, layout)
    assert out.dtype == torch.bfloat16
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("stride", [160, 162, 163])
def test_int4_activation_rows_with_any_stride(stride):
    # fp16 rows are read as int32 pairs: an even row stride is used as is, an odd one (whose pairs
    # straddle words) is copied first; both must give the reference.
    layout, _, views, slots = make_pool("int4", 160, 64, 4)
    ids, w = make_routing(2, 4, 2)
    big = torch.randn(2, stride, generator=torch.Generator().manual_seed(3)).half()
    x = big[:, :160]
    out = fused_moe(x, ids, w, slots, views, layout, WIDE_TILES)
    torch.testing.assert_close(out, fused_moe_ref(x, ids, w, slots, views, layout), **TOLERANCES[torch.float16])


@pytest.mark.parametrize("fmt, group", [("int4", 32), ("int4", 64), ("fp8", 32), ("fp16", 32)])
def test_one_chunk_wider_than_k(fmt, group):
    # The one-token setting: a chunk wider than K (192 -> 256, 64 -> 64) reads each row in one go;
    # for int4 the chunk holds whole groups of which the last ones are masked. Down rows four to a
    # program (ONE_SHOT's one row a program is tested at top_k 3): the interpreter runs each program.
    cfg = MoeLaunchConfig("decode", TileConfig(4, 1024), TileConfig(4, 1024))
    run_case(fmt, torch.float32 if fmt != "fp16" else torch.float16, hidden=192, ffn=64, experts=5,
             tokens=1, top_k=2, cfg=cfg, group=group)


@pytest.mark.parametrize("fmt", ["fp32", "int4"])
def test_top_k_not_a_power_of_two(fmt):
    # The down kernel pads k (3) to 4 rows of experts: the padded expert must add nothing.
    run_case(fmt, torch.float32, hidden=64, ffn=32, experts=5, tokens=2, top_k=3, cfg=ONE_SHOT)


def _planes_of(q):
    """Torch version of the activation planes: ``q [R, K]`` int -> ``[R, 4, K/8, 2]`` (plane, word,
    half), plane p holding elements (0, 2), (4, 6), (1, 3), (5, 7) of each word."""
    r, k = q.shape
    words = q.view(r, k // 8, 8)
    return torch.stack([words[:, :, [0, 2]], words[:, :, [4, 6]], words[:, :, [1, 3]], words[:, :, [5, 7]]], 1)


@jit
def h_words_kernel(v_ptr, hq_ptr, hv_ptr, K: tl.constexpr):
    # Row program_id(0) of v (stride 260) as the up kernel writes h: planes, one scale per word.
    row = tl.program_id(0)
    v = tl.load(v_ptr + row * 260 + tl.arange(0, K)).to(tl.float32)
    store_h_words(v, 0, hq_ptr + row * K, hv_ptr + row * (K // 8), K, K // 8, K)


def test_int4_activation_planes_and_scales():
    # Both producers of 16-bit activations on two fp16 rows of K = 192 (24 words) with an odd row
    # stride: x as the prep kernel writes it (one scale per group of 64, with each group's sum of q)
    # and h as the up kernel writes it (one scale per word). q = round(v / sv), sv = max |v| / 32767,
    # in the plane layout the dp2a bytes expect; a block of zeros stays zero.
    x = torch.randn(2, 260, generator=torch.Generator().manual_seed(2)).half()
    x[1, 64:128] = 0
    v = x[:, :192].float()
    xq, xs, xv, _ = act16(x[:, :192], 64)
    hq, hv = torch.empty(2, 128, dtype=torch.int32), torch.empty(2, 32)
    h_words_kernel[(2,)](x, hq.view(torch.int16), hv, K=256)
    hq, hv = hq.view(torch.int16).view(2, 4, 32, 2)[:, :, :24].contiguous(), hv[:, :24]
    for q, sv, block in ((xq.view(torch.int16).view(2, 4, 24, 2), xv, 64), (hq, hv, 8)):
        want_sv = v.view(2, -1, block).abs().amax(-1) / 32767
        torch.testing.assert_close(sv, want_sv)
        want_q = (v.view(2, -1, block) / want_sv.clamp_min(1e-30)[..., None]).round().view(2, 192)
        assert (q.float() - _planes_of(want_q)).abs().max() <= 1        # rounding ties may go either way
        back = torch.zeros(2, 24, 8)
        for p, cols in enumerate(([0, 2], [4, 6], [1, 3], [5, 7])):
            back[:, :, cols] = q[:, p].float()
        back = back.view(2, 192)
        step = sv.repeat_interleave(block, 1)
        assert ((back * step - v).abs() <= step / 2 + 1e-9).all()        # within half a step
        assert not back[1, 64:128].any()
    got_x = xq.view(torch.int16).view(2, 4, 3, 8, 2).float()            # plane, group, word, half
    torch.testing.assert_close(xs.float(), got_x.sum((1, 3, 4)), rtol=0, atol=0)   # each group's sum of q
    ref = act16_ref(x[:, :192], 64)                                     # the torch version, bit for bit
    assert all(torch.equal(a, b) for a, b in zip((xq, xs, xv), ref[:3]))


@pytest.mark.parametrize("group", [32, 64])
def test_int4_takes_x_as_planes(group):
    # The engine's int4 decode passes x already as 16-bit planes (written by the add + RMSNorm before
    # the router), and the kernels skip their prep launch: the same planes give the same output, bit
    # for bit. Planes of another group size or of other rows are refused with the way to make them.
    layout, _, views, slots = make_pool("int4", 128, 64, 5, group_size=group)
    ids, w = make_routing(2, 5, 3)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(4))
    out = fused_moe(x, ids, w, slots, views, layout, DECODE)
    assert torch.equal(fused_moe(x, ids, w, slots, views, layout, DECODE, x16=act16(x, group)), out)
    with pytest.raises(ValueError, match=f"build it with group={group}"):
        fused_moe(x, ids, w, slots, views, layout, DECODE, x16=act16(x, 128 if group != 128 else 64))
    with pytest.raises(ValueError, match="act16"):
        fused_moe(x, ids, w, slots, views, layout, DECODE, x16=act16(x[:1], group))


@pytest.mark.parametrize("cfg", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_one_token_top1(cfg):
    # The decode step of one request with a Switch-style router (k = 1).
    run_case("fp32", torch.float32, hidden=32, ffn=16, experts=4, tokens=1, top_k=1, cfg=cfg)


@pytest.mark.parametrize("cfg", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_top_k_equals_experts(cfg):
    # Every token visits every expert: the per-expert groups are as large as they get.
    run_case("fp16", torch.float16, hidden=32, ffn=16, experts=4, tokens=5, top_k=4, cfg=cfg)


def test_prefill_experts_without_tokens_and_many_blocks():
    # 40 tokens over 3 of 8 experts: several full and partial blocks per used expert, five experts
    # that receive nothing (their groups must be empty, not a block of padding).
    run_case("int4", torch.float32, hidden=64, ffn=32, experts=8, tokens=40, top_k=2, cfg=PREFILL,
             used=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group, block_k", [(32, 32), (64, 64), (128, 64), (128, 128)])
def test_int4_prefill_tiles_of_joined_nibbles(dtype, group, block_k):
    # A launch setting with ``join`` takes int4 prefill tiles as each byte's two nibbles minus the zero
    # point, joined back into K order, the group's scale applied after one dot per tile
    # (kernels/moe_prefill.py): it computes what the reference does for tiles of a group and half a
    # group, several blocks per expert. K is kept to two to four tiles a GEMM (one where the down GEMM's
    # K of 128 is one 128-wide tile; groups of 128 are two along the up GEMM's K): the interpreter's time
    # grows with the tiles.
    cfg = MoeLaunchConfig("prefill", TileConfig(16, block_k), TileConfig(16, block_k), block_m=16, join=True)
    run_case("int4", dtype, hidden=256 if group == 128 else 128, ffn=96 if group == 32 else 128, experts=5,
             tokens=24, top_k=2, cfg=cfg, group=group, used=4)


def test_default_settings_pick_a_variant_by_token_count():
    # Without an explicit setting the launcher reads kernels/configs (CPU falls back to default.json):
    # 2 tokens run the decode variant and 20 the prefill one; both must agree with the reference.
    for tokens in (2, 20):
        run_case("fp8", torch.float32, hidden=32, ffn=32, experts=4, tokens=tokens, top_k=2, cfg=None)


@pytest.mark.parametrize("cfg", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_result_is_deterministic_and_ignores_int64_ids(cfg):
    # Reduction over k in a fixed order, not atomics: two runs are bitwise equal; int64 ids work.
    layout, _, views, slots = make_pool("fp16", 32, 16, 4)
    ids, w = make_routing(3, 4, 2)
    x = torch.randn(3, 32).half()
    a = fused_moe(x, ids, w, slots, views, layout, cfg)
    b = fused_moe(x, ids.long(), w, slots, views, layout, cfg)
    assert torch.equal(a, b)


def test_rejects_mismatched_inputs():
    # Wrong shapes and dtypes name the offending argument instead of reading out of bounds.
    layout, _, views, slots = make_pool("fp32", 32, 16, 4)
    ids, w = make_routing(2, 4, 2)
    with pytest.raises(ValueError, match="x must be"):
        fused_moe(torch.randn(2, 31), ids, w, slots, views, layout)
    with pytest.raises(ValueError, match="slot_of_expert"):
        fused_moe(torch.randn(2, 32), ids, w, slots.long(), views, layout)
    with pytest.raises(ValueError, match="topk_weights"):
        fused_moe(torch.randn(2, 32), ids, w[:, :1], slots, views, layout)
    with pytest.raises(ValueError, match="pool view w2"):
        fused_moe(torch.randn(2, 32), ids, w, slots, {**views, "w2": views["w2"].transpose(1, 2)}, layout)


def _store_and_pool(fmt, hidden, ffn, experts, layers, group, resident, bias=False, act=None):
    """A host store of ``layers * experts`` random experts and a pool holding layer 1's ``resident``
    experts at scrambled slots (the rest of its slot table -1, the spare slots garbage); with ``bias``
    the experts carry random biases, ``act`` is the layout's activation."""
    g = torch.Generator().manual_seed(3)
    layout = ExpertLayout.make(fmt, hidden, ffn, group, bias=bias, act=act)
    rows = torch.randint(0, 255, (layers * experts, layout.nbytes), dtype=torch.uint8, generator=g)
    for r in range(layers * experts):
        w13 = torch.randn(2 * ffn, hidden, generator=g) / hidden ** 0.5
        w2 = torch.randn(hidden, ffn, generator=g) / ffn ** 0.5
        b13, b2 = (torch.randn(2 * ffn, generator=g), torch.randn(hidden, generator=g) / 2) if bias else (None, None)
        layout.pack(quantize_expert(w13, w2, layout, b13, b2), rows[r])
    buf = torch.randint(0, 255, (len(resident) + 2, layout.nbytes), dtype=torch.uint8, generator=g)
    slots = torch.full((experts,), -1, dtype=torch.int32)
    order = torch.randperm(buf.shape[0], generator=g).tolist()
    for s, e in zip(order, resident):
        buf[s].copy_(rows[experts + e])
        slots[e] = s
    return layout, rows, buf, slots


@pytest.mark.parametrize("fmt, dtype", [("fp32", torch.float32), ("fp16", torch.float16), ("fp8", torch.float32),
                                        ("int4", torch.float32), ("int4", torch.float16)])
@pytest.mark.parametrize("tokens", [1, 3])
def test_direct_reads_of_experts_without_a_slot(fmt, dtype, tokens):
    # Layer 1 of a two-layer store, half its experts in the pool: slot -1 must read store row
    # E + expert (not row expert: that is layer 0's), with the pool's strides, in the up and the
    # down kernel; the result equals the all-resident computation.
    experts, hidden, ffn = 6, 64, 32
    layout, rows, buf, slots = _store_and_pool(fmt, hidden, ffn, experts, 2, 32, resident=[1, 4, 5])
    host = HostExperts(layout.views(rows), row_base=experts)
    ids, w = make_routing(tokens, experts, 3)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(5)).to(dtype)
    out = fused_moe(x, ids, w, slots, layout.views(buf), layout, DECODE, host=host)
    every = torch.arange(experts, 2 * experts, dtype=torch.int32)        # all of layer 1, read as pool slots
    want = fused_moe_ref(x, ids, w, every, layout.views(rows), layout)
    assert (slots[ids.long()] < 0).any() and (slots[ids.long()] >= 0).any()   # both paths are taken
    torch.testing.assert_close(fused_moe_ref(x, ids, w, slots, layout.views(buf), layout, host), want, rtol=0, atol=0)
    torch.testing.assert_close(out, want, **tolerance(fmt, dtype))


@pytest.mark.parametrize("fmt, dtype", [("fp32", torch.float32), ("fp8", torch.float32), ("int4", torch.float16)])
@pytest.mark.parametrize("tokens", [1, 3])
def test_direct_reads_write_experts_into_their_fill_slots(fmt, dtype, tokens):
    # Experts read from the store that have a fill slot are written into it as they are read, every
    # matrix and scale whole (up rows, down rows, all K chunks), and no other slot is written: the
    # next step finds them in the pool. Same on the reference path.
    experts, hidden, ffn = 6, 64, 32
    layout, rows, buf, slots = _store_and_pool(fmt, hidden, ffn, experts, 2, 32, resident=[1, 4])
    free = [s for s in range(buf.shape[0]) if s not in slots.tolist()]            # 2 spare slots
    ids, w = make_routing(tokens, experts, 3)
    missing = sorted({int(e) for e in ids.flatten() if slots[int(e)] < 0})
    fill = torch.full((experts,), -1, dtype=torch.int32)
    for e, s in zip(missing, free):                                                # some misses get none
        fill[e] = s
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = fused_moe_ref(x, ids, w, slots, layout.views(buf.clone()), layout,
                         HostExperts(layout.views(rows), experts))
    for run in (fused_moe, fused_moe_ref):
        pool = buf.clone()
        args = (x, ids, w, slots, layout.views(pool), layout)
        out = run(*args, DECODE, host=HostExperts(layout.views(rows), experts, fill)) if run is fused_moe else \
            run(*args, HostExperts(layout.views(rows), experts, fill))
        torch.testing.assert_close(out, want, **(tolerance(fmt, dtype) if run is fused_moe else dict(rtol=0, atol=0)))
        got, src = layout.views(pool), layout.views(rows)
        for e, s in zip(missing, free):                 # every tensor (the layout's padding aside)
            for name in got:
                assert torch.equal(got[name][s], src[name][experts + e]), (run.__name__, e, name)
        untouched = [s for s in range(buf.shape[0]) if s not in free[:len(missing)]]
        assert torch.equal(pool[untouched], buf[untouched])


def test_direct_reads_need_a_host_store():
    layout, rows, buf, slots = _store_and_pool("fp32", 32, 16, 4, 2, 32, resident=[0])
    ids, w = torch.tensor([[1]], dtype=torch.int32), torch.ones(1, 1)
    with pytest.raises(ValueError, match="no pool slot"):
        fused_moe_ref(torch.randn(1, 32), ids, w, slots, layout.views(buf), layout)


@pytest.mark.parametrize("fmt, dtype", [("fp32", torch.float32), ("fp8", torch.float32), ("int4", torch.float16),
                                        ("mxfp4", torch.float32)])
@pytest.mark.parametrize("tokens", [1, 3])
def test_pairs_the_host_cpu_computes_are_skipped(fmt, dtype, tokens):
    # Experts marked SLOT_CPU in the snapshot are the host CPU's this step: the decode kernels add
    # nothing for their pairs (and the reference agrees), so the layer's output is the sum over the
    # other pairs; the host's sum is added later (kernels/cpu_share.py).
    experts, hidden, ffn = 6, 64, 32
    group = 32
    layout, rows, buf, slots = _store_and_pool(fmt, hidden, ffn, experts, 2, group, resident=[1, 4])
    host = HostExperts(layout.views(rows), row_base=experts)
    ids, w = make_routing(tokens, experts, 3)
    missing = sorted({int(e) for e in ids.flatten() if slots[int(e)] < 0})
    cpu = missing[:max(1, len(missing) // 2)]
    marked = slots.clone()
    marked[cpu] = SLOT_CPU
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(5)).to(dtype)
    keep = torch.tensor([[int(e) not in cpu for e in row] for row in ids.tolist()])
    want = fused_moe_ref(x, ids, w * keep, slots, layout.views(buf), layout, host)     # CPU pairs weigh 0
    ref = fused_moe_ref(x, ids, w, marked, layout.views(buf), layout, host)
    torch.testing.assert_close(ref, want, rtol=0, atol=0)
    out = fused_moe(x, ids, w, marked, layout.views(buf), layout, DECODE, host=host)
    torch.testing.assert_close(out, want, **tolerance(fmt, dtype))
