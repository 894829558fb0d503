"""Quantisation of expert weights: error bounds, byte layout, degenerate groups, pool round trip."""
import pytest
import torch

from engine.errors import ConfigError
from kernels.expert_layout import ExpertLayout
from kernels.quant import (dequantize_expert_matrix, dequantize_fp8, dequantize_int4, pack_nibbles,
                          quantize_expert, quantize_fp8, quantize_int4, quantize_int4_calibrated,
                          unpack_nibbles)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip_error_is_half_a_step(group):
    # Round-to-nearest must land within half a quantisation step of every weight (plus the float16
    # rounding of the scale), at every supported group size.
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(group)) * 0.05
    q, scale, zero = quantize_int4(w, group)
    assert q.dtype == torch.uint8 and q.shape == (24, 128)
    assert scale.dtype == torch.float16 and scale.shape == (24, 256 // group)
    assert zero.dtype == torch.uint8 and int(zero.max()) <= 15
    err = (w - dequantize_int4(q, scale, zero, group)).abs().view(24, -1, group)
    assert (err <= 0.51 * scale.float()[..., None] + 1e-7).all()
    assert err.mean() < 0.3 * scale.float().mean()   # not merely bounded: actually nearest


def test_nibble_order_low_nibble_is_even_k():
    # The byte layout is a contract with the kernels and converted files: k = 2j low, 2j + 1 high.
    w = (torch.arange(64) % 16).float().view(1, 64)   # one group spans 0..15: scale 1, zero 0
    q, scale, zero = quantize_int4(w, 32)
    assert float(scale[0, 0]) == 1.0 and int(zero[0, 0]) == 0
    assert int(q[0, 0]) == 0x10 and int(q[0, 1]) == 0x32 and int(q[0, 7]) == 0xFE
    assert torch.equal(unpack_nibbles(pack_nibbles(w.to(torch.uint8))), w.to(torch.uint8))


def test_int4_zero_and_constant_groups():
    # An all-zero group would divide by a zero range; a constant group has no spread at all.
    w = torch.randn(3, 64)
    w[0, :32] = 0.0
    w[1, 32:] = 0.3
    w[2, :32] = -1e-9                                 # underflows float16 as a scale
    q, scale, zero = quantize_int4(w, 32)
    assert torch.isfinite(scale.float()).all() and (scale.float() > 0).all()
    d = dequantize_int4(q, scale, zero, 32)
    assert torch.equal(d[0, :32], torch.zeros(32))
    assert torch.allclose(d[1, 32:], torch.full((32,), 0.3), atol=0.3 / 15 / 2 + 1e-3)
    assert d[2, :32].abs().max() < 1e-6


@pytest.mark.parametrize("group, k", [(48, 96), (64, 96)])
def test_int4_rejects_bad_group(group, k):
    # Unsupported sizes and sizes that do not divide K must say so, not produce a garbled layout.
    with pytest.raises(ConfigError, match="group size"):
        quantize_int4(torch.randn(4, k), group)


def test_fp8_round_trip_and_zero_row():
    # e4m3 keeps 3 mantissa bits: relative error <= 1/16 of the value above the subnormal range.
    w = torch.randn(16, 96) * 0.02
    w[3] = 0.0
    q, scale = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (16,) and float(scale[3]) == 1.0
    d = dequantize_fp8(q, scale)
    bound = w.abs() / 16 + scale[:, None] * 2.0 ** -9
    assert ((w - d).abs() <= bound).all()
    assert torch.equal(d[3], torch.zeros(96))
    assert torch.allclose(d.abs().amax(1)[:3], w.abs().amax(1)[:3])   # the row max is exact


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "bf16", "fp8", "int4"])
def test_expert_pack_and_read_back(fmt):
    # quantize_expert -> layout.pack -> pool views -> dequantize_expert_matrix is the path from
    # conversion to the reference MoE; every format must survive it within its own precision.
    layout = ExpertLayout.make(fmt, 64, 32, 32)
    w13, w2 = torch.randn(64, 64) * 0.1, torch.randn(64, 32) * 0.1
    buf = torch.zeros(3, layout.nbytes, dtype=torch.uint8)
    layout.pack(quantize_expert(w13, w2, layout), buf[2])
    views = layout.views(buf)
    tol = {"fp32": 0, "fp16": 1e-3, "bf16": 1e-3, "fp8": 0.02, "int4": 0.04}[fmt]
    for name, w in (("w13", w13), ("w2", w2)):
        d = dequantize_expert_matrix(views, name, 2, layout, torch.float32)
        assert d.shape == w.shape
        assert (d - w).abs().max() <= tol
    with pytest.raises(ValueError, match="w2"):
        quantize_expert(w13, w2.t(), layout)


def test_calibrated_int4_beats_round_to_nearest_with_outliers():
    # One outlier per group wastes most of round-to-nearest's levels; the activation-aware clip
    # search must find a range with a smaller output error on the calibration activations.
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 128, generator=g) * 0.02
    w[:, ::32] = 0.5
    x = torch.randn(64, 128, generator=g)
    x[:, ::32] = 0.01                                  # the outlier weights meet tiny activations
    def out_err(q, s, z):
        return ((x @ (w - dequantize_int4(q, s, z, 32)).t()) ** 2).mean()
    rtn = out_err(*quantize_int4(w, 32))
    cal = out_err(*quantize_int4_calibrated(w, x, 32))
    assert cal < 0.5 * rtn


@pytest.mark.parametrize("fmt, hidden, ffn, group, says", [
    ("int4", 80, 96, 128, "int4 experts in groups of 128 need a hidden size and expert FFN that are multiples of it "
                          "(this model has 80 and 96); use --weight-format fp8 or bf16"),
    ("int4", 96, 160, 128, "(this model has 96 and 160); pass --group-size 32"),
    ("int4", 192, 320, 128, "pass --group-size 64 or 32"),
    ("mxfp4", 80, 64, 32, "mxfp4 experts need a hidden size and expert FFN that are multiples of 32 (this model has "
                          "80 and 64); use --weight-format int4, fp8 or bf16"),
])
def test_a_layout_the_experts_cannot_take_names_the_model_dims_and_the_flag_that_fits(fmt, hidden, ffn, group, says):
    with pytest.raises(ConfigError) as e:
        ExpertLayout.make(fmt, hidden, ffn, group)
    assert says in str(e.value) and "w13" not in str(e.value)
