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
from kernels.moe_decode_4bit import _FP4_DOT8_ASM, _dot8  # noqa: E402
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


def _run_dot8_ptx(w: int, planes: list[int]) -> int:
    """The 4-bit decode kernels' MXFP4 PTX (run only on a GPU) evaluated here: its straight-line
    mov/and/shr/or/prmt and dp2a on b32 for one weight word ``w`` and activation planes ``$2 .. $5``."""
    mask = 0xFFFFFFFF
    regs = {"$1": w, **{f"${i + 2}": p & mask for i, p in enumerate(planes)}}

    def val(a: str) -> int:
        return regs[a] if a in regs else int(a, 0) & mask

    def prmt(a: int, b: int, c: int) -> int:                    # generic mode: bit 3 of a selector replicates a sign
        src = (b << 32 | a).to_bytes(8, "little")
        out = 0
        for j in range(4):
            sel = (c >> 4 * j) & 15
            byte = src[sel & 7]
            out |= ((0xFF if byte & 0x80 else 0) if sel & 8 else byte) << 8 * j
        return out

    def s16(v: int) -> int:
        return v - (1 << 16) if v & 0x8000 else v

    def s8(v: int) -> int:
        return v - (1 << 8) if v & 0x80 else v

    def dp2a(a: int, b: int, c: int, hi: bool) -> int:
        b0, b1 = (b >> (16 if hi else 0)) & 255, (b >> (24 if hi else 8)) & 255
        return (s16(a & 0xFFFF) * s8(b0) + s16(a >> 16) * s8(b1) + (c - (1 << 32) if c & 1 << 31 else c)) & mask

    for ins in _FP4_DOT8_ASM.value.strip("{} ").split(";"):
        op, _, rest = ins.strip().partition(" ")
        if op.startswith(".reg") or not op:
            continue
        d, *a = (r.strip() for r in rest.split(","))
        regs[d] = {"mov.b32": lambda: val(a[0]), "and.b32": lambda: val(a[0]) & val(a[1]),
                   "or.b32": lambda: val(a[0]) | val(a[1]), "shr.u32": lambda: val(a[0]) >> val(a[1]),
                   "prmt.b32": lambda: prmt(val(a[0]), val(a[1]), val(a[2])),
                   "dp2a.lo.s32.s32": lambda: dp2a(val(a[0]), val(a[1]), val(a[2]), False),
                   "dp2a.hi.s32.s32": lambda: dp2a(val(a[0]), val(a[1]), val(a[2]), True)}[op]()
    return regs["$0"] - (1 << 32) if regs["$0"] & 1 << 31 else regs["$0"]


def test_mxfp4_dot8_ptx_takes_every_nibble_at_every_position_as_twice_its_value():
    # The GPU looks e2m1 nibbles up with byte permutes and multiplies them with 16-bit activations
    # by dp2a, in PTX the interpreter cannot run: the same instructions evaluated on words of every
    # nibble at every position (and mixed ones), against activations at the int16 extremes, give
    # twice dequantize_mxfp4's values dotted with them, as do the kernels' plain operations.
    g = torch.Generator().manual_seed(3)
    words = [v * 0x11111111 for v in range(16)] + [0x76543210, 0xFEDCBA98, 0x8F1E2D3C, 0x01234567]
    for word in words:
        blocks = torch.tensor(list(word.to_bytes(4, "little")) + [0] * 12, dtype=torch.uint8)[None]   # a group
        vals = (2 * dequantize_mxfp4(blocks, torch.tensor([[127]], dtype=torch.uint8))[0, :8]).long()
        for q in ([32767] * 8, [-32767] * 8, torch.randint(-32767, 32768, (8,), generator=g).tolist()):
            planes = [(q[i] & 0xFFFF) | (q[j] & 0xFFFF) << 16 for i, j in ((0, 2), (4, 6), (1, 3), (5, 7))]
            want = int((vals * torch.tensor(q)).sum())
            assert _run_dot8_ptx(word, planes) == want, hex(word)
            as_i32 = [p - (1 << 32) if p & 1 << 31 else p for p in planes]
            assert _plain_dot8(word - (1 << 32) if word & 1 << 31 else word, as_i32) == want, hex(word)


@jit
def _plain_dot8_kernel(w_ptr, x_ptr, out_ptr):
    w = tl.load(w_ptr + tl.arange(0, 1))
    xa, xb, xc, xd = (tl.load(x_ptr + i + tl.arange(0, 1)) for i in range(4))
    tl.store(out_ptr + tl.arange(0, 1), _dot8(w, xa, xb, xc, xd, (False, True)))


def _plain_dot8(word: int, planes: list[int]) -> int:
    out = torch.zeros(1, dtype=torch.int32)
    _plain_dot8_kernel[(1,)](torch.tensor([word], dtype=torch.int32), torch.tensor(planes, dtype=torch.int32), out)
    return int(out[0])


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

