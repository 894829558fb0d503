"""8-bit resident linear layers: the Triton kernel (run by the interpreter here) against its reference,
and the row quantiser against the matrix it quantises."""
from __future__ import annotations

import pytest
import torch

from kernels.qlinear import QuantWeight, gemv16, gemv16_fits, linear, qlinear, qlinear_ref, quantize_rows

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture(autouse=True)
def small_lm_heads(monkeypatch):
    # An LM head's tiles start at LM_HEAD_ROWS rows (32768): lowered to 64 here, a 72-row matrix takes them
    # with a partial last tile, where the interpreter would run half a thousand programs for a real one
    import kernels.qlinear as qlinear_module
    monkeypatch.setattr(qlinear_module, "LM_HEAD_ROWS", 64)


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("T,N,K,dtype,bias", [
    (1, 40, 64, torch.float32, True),      # one decode token; N not a multiple of the tile
    (1, 24, 2880, torch.float32, False),   # one token, 8-row tiles, K not a multiple of their 512
    (1, 16, 4100, torch.float16, True),    # one token, K >= 4096: 1024-wide K runs with a masked tail
    (1, 72, 48, torch.float32, False),     # one token, an LM head (LM_HEAD_ROWS lowered to 64): 16 x 64 tiles, a
                                           # partial last
    (3, 70, 100, torch.float16, True),     # K not a multiple of BLOCK_K: the masked tail of the K loop
    (20, 33, 48, torch.float32, False),    # more tokens than one 16-row tile: a second tile along T
    (40, 130, 64, torch.float32, True),    # a prefill-sized step: the prefill tiles
])
def test_kernel_matches_reference(fmt, T, N, K, dtype, bias):
    g = torch.Generator().manual_seed(T * 1000 + N)
    w = quantize_rows(torch.randn(N, K, generator=g), fmt)
    x = torch.randn(T, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g) if bias else None
    torch.testing.assert_close(qlinear(x, w, b).float(), qlinear_ref(x, w, b).float(), **TOL[dtype])


@pytest.mark.parametrize("N,K,dtype,bias", [
    (40, 64, torch.float32, True),         # N not a multiple of the tile
    (24, 2880, torch.float16, False),      # 8-row tiles, K not a multiple of their 512
    (16, 4100, torch.float16, True),       # K >= 4096: 1024-wide K runs with a masked tail
    (72, 48, torch.float32, False),        # an LM head (LM_HEAD_ROWS lowered to 64): 16 x 64 tiles, a partial last
])
def test_the_16_bit_one_token_kernel_matches_torch(N, K, dtype, bias):
    # the same one-token kernel without a row scale, for 16-bit matrices and routers (float32 here: the
    # interpreter's bfloat16 arithmetic is not the GPU's)
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g).to(dtype)
    x = torch.randn(1, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(gemv16(x, w, b).float(), want, **TOL[dtype])


def test_gemv16_is_taken_only_where_asked_and_it_fits(monkeypatch):
    import kernels.qlinear as ql
    x, w = torch.randn(1, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    monkeypatch.setattr(ql, "GEMV16", False)
    assert not gemv16_fits(x, w)                              # off where asked
    monkeypatch.setattr(ql, "GEMV16", True)
    assert not gemv16_fits(x, w)                              # on the CPU torch does it
    with pytest.raises(ValueError, match="must be one row of w's width"):
        gemv16(torch.randn(2, 8), w.float())


def test_an_lm_head_is_left_to_the_library_even_where_gemv16_fits(monkeypatch):
    import kernels.qlinear as ql
    x, w = torch.randn(1, 8), torch.randn(4, 8)
    monkeypatch.setattr(ql, "gemv16_fits", lambda *_: True)
    monkeypatch.setattr(ql, "gemv16", lambda *_a: pytest.fail("an LM head went to gemv16"))
    torch.testing.assert_close(linear(x, w, kernel=True, head=True), x @ w.t())
    with pytest.raises(BaseException):
        linear(x, w, kernel=True)                 # any other matrix does take it


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_reference_is_the_dequantised_matrix(fmt):
    g = torch.Generator().manual_seed(1)
    w = quantize_rows(torch.randn(24, 32, generator=g), fmt)
    x, b = torch.randn(5, 32, generator=g), torch.randn(24, generator=g)
    torch.testing.assert_close(qlinear_ref(x, w, b), x @ w.dequantize().t() + b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear(x, w, b), qlinear_ref(x, w, b))


def test_quantisation_error_is_bounded_per_row():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 256, generator=g) * torch.logspace(-3, 2, 16)[:, None]   # rows of very different scale
    w[3] = 0.0                                                                   # an all-zero row
    i8 = quantize_rows(w, "int8")
    assert i8.q.dtype == torch.int8 and i8.scale.shape == (16,)
    assert torch.all((i8.dequantize() - w).abs() <= i8.scale[:, None] / 2 + 1e-6)     # round to nearest
    f8 = quantize_rows(w, "fp8")
    assert f8.q.dtype == torch.float8_e4m3fn
    amax = w.abs().amax(1, keepdim=True)
    assert torch.all((f8.dequantize() - w).abs() <= amax / 16 + 1e-9)   # 3 mantissa bits below the row's top
    assert i8.scale[3] == 1.0 and f8.scale[3] == 1.0 and not i8.q[3].any()


def test_quantiser_works_in_chunks_like_whole(monkeypatch):
    import kernels.qlinear as ql
    w = torch.randn(50, 16, generator=torch.Generator().manual_seed(3))
    whole = quantize_rows(w, "int8")
    monkeypatch.setattr(ql, "_QUANT_CHUNK_ROWS", 7)
    parts = quantize_rows(w, "int8")
    assert torch.equal(whole.q, parts.q) and torch.equal(whole.scale, parts.scale)
    torch.testing.assert_close(qlinear_ref(w[:3], parts), qlinear_ref(w[:3], whole))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="int4"):
        quantize_rows(torch.ones(2, 2), "int4")
    w = QuantWeight(torch.zeros(4, 8, dtype=torch.int8), torch.ones(4), "int8")
    with pytest.raises(ValueError, match="does not match"):
        qlinear(torch.ones(1, 6), w)



@pytest.mark.parametrize("T", [1, 5, 40])    # the GEMV, the decode tiles, the prefill tiles
def test_the_engine_path_matches_the_reference(T):
    g = torch.Generator().manual_seed(T)
    w = quantize_rows(torch.randn(40, 48, generator=g), "int8")
    x, b = torch.randn(T, 48, generator=g), torch.randn(40, generator=g)
    torch.testing.assert_close(linear(x, w, b, kernel=True), qlinear_ref(x, w, b), atol=1e-4, rtol=1e-4)
