"""Triton fused MoE with MXFP4 experts, expert biases and gpt-oss's clamped SwiGLU, against
``fused_moe_ref`` under the interpreter.

Pools come from ``test_fused_moe._store_and_pool``: layer 1 of a two-layer host store, its experts at
scrambled pool slots next to slots of random bytes, so a wrong slot, stride, scale group or bias row
fails. The activation's limit is small enough that the clamps bite.
"""
from dataclasses import replace

import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.expert_layout import ExpertAct  # noqa: E402
from kernels.quant.mxfp4 import dequantize_mxfp4  # noqa: E402
from kernels._triton import jit, tl  # noqa: E402
from kernels.fused_moe import fused_moe, fused_moe_ref  # noqa: E402
from kernels.moe_config import MoeLaunchConfig, TileConfig  # noqa: E402
from kernels.moe_decode import _FP4_WORD_ASM  # noqa: E402
from kernels.moe_decode_common import e8m0, fp4_pair  # noqa: E402
from kernels.moe_weights import FMT_MXFP4, HostExperts, expert_format, pool_matrix  # noqa: E402
from tests.kernels.helpers import make_routing, tolerance  # noqa: E402
from tests.kernels.test_fused_moe import DECODE, PREFILL, _store_and_pool  # noqa: E402

GPT_OSS = ExpertAct("swiglu_oai", alpha=1.702, limit=0.75)
WIDE_DECODE = MoeLaunchConfig("decode", TileConfig(16, 64), TileConfig(16, 64))        # 2 groups a chunk
WIDE_PREFILL = MoeLaunchConfig("prefill", TileConfig(16, 64), TileConfig(16, 64), block_m=16)
ONE_CHUNK = MoeLaunchConfig("decode", TileConfig(16, 256), TileConfig(16, 256))        # wider than K
RAGGED = MoeLaunchConfig("decode", TileConfig(64, 64), TileConfig(64, 64))             # tiles past F and D
EXPERTS = 6


def _pool(fmt, hidden, ffn, group=32, bias=False, act=None, resident=range(EXPERTS)):
    """``(layout, store rows, pool bytes, slot table)``: layer 1's ``resident`` experts in the pool."""
    return _store_and_pool(fmt, hidden, ffn, EXPERTS, 2, group, list(resident), bias=bias, act=act)


def _check(fmt, dtype, hidden, ffn, tokens, top_k, cfg, group=32, bias=False, act=None):
    """fused_moe against fused_moe_ref on one pool; returns the layout, views, routing and x."""
    layout, _, buf, slots = _pool(fmt, hidden, ffn, group, bias, act)
    views = layout.views(buf)
    ids, w = make_routing(tokens, EXPERTS, top_k)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = fused_moe(x, ids, w, slots, views, layout, cfg)
    ref = fused_moe_ref(x, ids, w, slots, views, layout)
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    torch.testing.assert_close(out, ref, **tolerance(fmt, dtype))
    return layout, views, slots, ids, w, x, ref


@jit
def _decode_bytes_kernel(b_ptr, s_ptr, out_ptr, NB: tl.constexpr):
    # Row program_id(0): NB bytes with one scale byte per 16 of them, as the kernels decode them.
    row = tl.program_id(0)
    i = tl.arange(0, NB)
    lo, hi = fp4_pair(tl.load(b_ptr + row * NB + i))
    sc = e8m0(tl.load(s_ptr + row * (NB // 16) + i // 16)) * 16384.0
    tl.store(out_ptr + row * 2 * NB + 2 * i, lo * sc)
    tl.store(out_ptr + row * 2 * NB + 2 * i + 1, hi * sc)


def test_e2m1_and_e8m0_bits_decode_every_nibble_and_scale_exactly():
    # Every byte (so every nibble in both halves) under every scale byte 100..154: the kernels' bit
    # trick (nibble as fp16 bits, scale as float32 exponent) gives dequantize_mxfp4 bit for bit,
    # signs of zero included.
    blocks = torch.arange(256, dtype=torch.uint8).repeat(55, 1)                  # [55, 256]
    scales = torch.arange(100, 155, dtype=torch.uint8)[:, None].repeat(1, 16)     # [55, 16]
    out = torch.empty(55, 512)
    _decode_bytes_kernel[(55,)](blocks, scales, out, NB=256)
    want = dequantize_mxfp4(blocks, scales)
    assert torch.equal(out, want) and torch.equal(out.signbit(), want.signbit())
    assert torch.equal(want[:, 2], torch.ldexp(torch.full((55,), 0.5), scales[:, 0].int() - 127))  # byte 1: 0.5


def _run_word_ptx(word: int) -> list[float]:
    """The decode kernels' PTX for one int32 word of nibbles (run only on a GPU), evaluated here: its
    straight-line shl/shr/and/or on b32, the split into b16 halves and cvt.f32.f16; ``$0 .. $7``."""
    regs, mask = {"$8": word}, 0xFFFFFFFF

    def val(a: str) -> int:
        return regs[a] if a in regs else int(a, 0)

    for ins in _FP4_WORD_ASM.value.strip("{} ").split(";"):
        op, _, rest = ins.strip().partition(" ")
        if op.startswith(".reg") or not op:
            continue
        if op == "mov.b32":                                                       # {l, h}, a
            halves, src = rest.rsplit(",", 1)
            lo, hi = (r.strip(" {}") for r in halves.split(","))
            regs[lo], regs[hi] = val(src.strip()) & 0xFFFF, val(src.strip()) >> 16
            continue
        d, a, *b = (r.strip() for r in rest.split(","))
        regs[d] = {"shl.b32": lambda: (val(a) << val(b[0])) & mask, "shr.b32": lambda: val(a) >> val(b[0]),
                   "and.b32": lambda: val(a) & val(b[0]), "or.b32": lambda: val(a) | val(b[0]),
                   "cvt.f32.f16": lambda: float(torch.tensor(val(a), dtype=torch.int32).to(torch.int16)
                                                .view(torch.float16))}[op]()
    return [regs[f"${i}"] for i in range(8)]


def test_mxfp4_word_ptx_decodes_every_nibble_at_every_position():
    # The GPU decodes eight nibbles of a word at once in PTX, which the interpreter cannot run: the
    # same instructions evaluated on words of every nibble at every position (and a few mixed words)
    # give dequantize_mxfp4's values times 2 ** -14, signs of zero included.
    words = [v * 0x11111111 for v in range(16)] + [0x76543210, 0xFEDCBA98, 0x8F1E2D3C, 0x01234567]
    for word in words:
        got = torch.tensor(_run_word_ptx(word))
        blocks = torch.tensor(list(word.to_bytes(4, "little")) + [0] * 12, dtype=torch.uint8)[None]   # a group
        want = dequantize_mxfp4(blocks, torch.tensor([[127]], dtype=torch.uint8))[0, :8] * 2.0 ** -14
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), hex(word)


def test_mxfp4_pool_views_and_constants():
    # The launch wraps the scale bytes [S, N, K/32] (no zero point) and the biases, and compiles for
    # the layout's activation.
    layout, _, buf, _ = _pool("mxfp4", 64, 32, bias=True, act=GPT_OSS)
    views = layout.views(buf)
    m = pool_matrix(views, "w13", layout)
    assert m.scale.dtype == torch.uint8 and tuple(m.scale.shape) == (buf.shape[0], 64, 2) and m.zero is m.w
    assert m.bias is views["w13_bias"] and m.bias_args() == (views["w13_bias"], views["w13_bias"].stride(0))
    c = expert_format(layout)
    assert (c.fmt, c.group, c.epi) == (FMT_MXFP4, 32, (1, 1.702, 0.75, True))


@pytest.mark.parametrize("tokens, cfg, dtype", [(1, ONE_CHUNK, torch.float32), (1, DECODE, torch.float16),
                                                (3, WIDE_DECODE, torch.float16)], ids=["1-one-chunk", "1", "3"])
def test_mxfp4_decode(tokens, cfg, dtype):
    # hidden and ffn 96: chunks of 64 end on half a chunk (a masked group) in both kernels; one chunk
    # wider than K reads each row in one go.
    _check("mxfp4", dtype, hidden=96, ffn=96, tokens=tokens, top_k=2, cfg=cfg)


def test_mxfp4_decode_tiles_past_the_rows_and_k_not_a_power_of_two():
    # 96 rows in tiles of 64 (rows past F in the up kernel, past D in the down kernel) and top-3
    # padded to 4 experts a token: the unmasked whole chunks read those rows clamped to real ones,
    # whose results must not reach h or the output.
    _check("mxfp4", torch.float16, hidden=96, ffn=96, tokens=2, top_k=3, cfg=RAGGED, bias=True, act=GPT_OSS)


@pytest.mark.parametrize("cfg, dtype", [(PREFILL, torch.float16), (WIDE_PREFILL, torch.float32)], ids=["k32", "k64"])
def test_mxfp4_prefill(cfg, dtype):
    # 20 tokens over 6 experts: several blocks per expert; tiles of 64 span two scale groups, and
    # K = 96 leaves half a tile.
    _check("mxfp4", dtype, hidden=96, ffn=64, tokens=20, top_k=2, cfg=cfg)


@pytest.mark.parametrize("fmt, dtype, group", [("fp16", torch.float16, 32), ("fp8", torch.float32, 32),
                                               ("int4", torch.float16, 32), ("int4", torch.float32, 64),
                                               ("mxfp4", torch.float16, 32)])
@pytest.mark.parametrize("cfg", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_biases_and_clamped_swiglu(fmt, dtype, group, cfg):
    # gpt-oss's experts in every format and both variants: gate/up biases before the clamped SwiGLU,
    # the down bias before the routing weight. The same bytes without biases or with SiLU give
    # another result, so each is really applied.
    layout, views, slots, ids, w, x, ref = _check(fmt, dtype, hidden=64, ffn=max(32, group),
                                                  tokens=3 if cfg is DECODE else 17, top_k=2, cfg=cfg, group=group,
                                                  bias=True, act=GPT_OSS)
    for changed in (replace(layout, act=ExpertAct()), replace(layout, bias=False)):
        alt = fused_moe_ref(x, ids, w, slots, views, changed)
        assert (alt.float() - ref.float()).abs().max() > 0.1


def _store_case(tokens, resident, bias=True, fmt="mxfp4"):
    """Layer 1 of a store of ``fmt`` experts with ``resident`` of them in the pool, the routing and x."""
    layout, rows, buf, slots = _pool(fmt, 64, 32, bias=bias, act=GPT_OSS if bias else None, resident=resident)
    ids, w = make_routing(tokens, EXPERTS, 3)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(5)).half()
    assert (slots[ids.long()] < 0).any() and (slots[ids.long()] >= 0).any()      # both paths are taken
    return layout, rows, buf, slots, ids, w, x


@pytest.mark.parametrize("tokens, bias", [(1, True), (3, False)])
def test_mxfp4_direct_reads_of_experts_without_a_slot(tokens, bias):
    # Slot -1 reads store row E + expert with the pool's strides: values, scale bytes and biases.
    layout, rows, buf, slots, ids, w, x = _store_case(tokens, [1, 3, 4], bias)
    out = fused_moe(x, ids, w, slots, layout.views(buf), layout, DECODE, host=HostExperts(layout.views(rows), EXPERTS))
    every = torch.arange(EXPERTS, 2 * EXPERTS, dtype=torch.int32)
    torch.testing.assert_close(out, fused_moe_ref(x, ids, w, every, layout.views(rows), layout),
                               **tolerance("mxfp4", x.dtype))


@pytest.mark.parametrize("fmt, tokens", [("mxfp4", 1), ("mxfp4", 3), ("int4", 3)])
def test_direct_reads_write_experts_and_biases_into_their_fill_slots(fmt, tokens):
    # A directly read expert with a fill slot is written there whole (values, scales, zero points,
    # biases), one without keeps its slot -1 and nothing else in the pool changes.
    layout, rows, buf, slots, ids, w, x = _store_case(tokens, [1, 3], fmt=fmt)
    free = [s for s in range(buf.shape[0]) if s not in slots.tolist()]
    missing = sorted({int(e) for e in ids.flatten() if slots[int(e)] < 0})
    fill = torch.full((EXPERTS,), -1, dtype=torch.int32)
    for e, s in zip(missing[:-1], free):                                          # the last miss gets none
        fill[e] = s
    want = fused_moe_ref(x, ids, w, slots, layout.views(buf.clone()), layout, HostExperts(layout.views(rows), EXPERTS))
    pool = buf.clone()
    out = fused_moe(x, ids, w, slots, layout.views(pool), layout, DECODE,
                    host=HostExperts(layout.views(rows), EXPERTS, fill))
    torch.testing.assert_close(out, want, **tolerance(fmt, x.dtype))
    got, src = layout.views(pool), layout.views(rows)
    assert {"w13_bias", "w2_bias", "w13_scale", "w2_scale"} <= set(got)
    for e, s in zip(missing[:-1], free):
        for name in got:
            assert torch.equal(got[name][s], src[name][EXPERTS + e]), (e, name)
    written = free[:len(missing) - 1]
    untouched = [s for s in range(buf.shape[0]) if s not in written]
    assert written and torch.equal(pool[untouched], buf[untouched])

