"""The 8-bit linear kernels on the GPU (tests/kernels runs them in the interpreter): bf16 activations at
gpt-oss's shapes, every path the engine takes (one token, decode tiles, prefill tiles)."""
from __future__ import annotations

import pytest
import torch

from kernels.qlinear import linear, quantize_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("T", [1, 8, 16, 17, 300])   # the GEMV, decode tiles, one past them, a prefill
@pytest.mark.parametrize("N,K", [(5120, 2880), (2880, 4096)])    # qkv (K not a multiple of 256), o
def test_linear_on_the_gpu_at_model_shapes(fmt, T, N, K):
    g = torch.Generator(device="cuda").manual_seed(T)
    w = quantize_rows(torch.randn(N, K, device="cuda", generator=g) * 0.02, fmt)
    x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
    want = x.float() @ w.dequantize().t() + b.float()
    torch.testing.assert_close(linear(x, w, b, kernel=True).float(), want, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("N,K", [(5120, 2048), (2048, 4096), (128, 2048), (151936, 2048)])   # qkv, o, router, head
def test_the_16_bit_one_token_kernel_on_the_gpu(N, K, monkeypatch):
    import kernels.qlinear as ql
    from kernels.qlinear import gemv16
    monkeypatch.setattr(ql, "GEMV16", True)
    g = torch.Generator(device="cuda").manual_seed(N)
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
    want = x.float() @ w.float().t()
    torch.testing.assert_close(gemv16(x, w).float(), want, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(linear(x, w, kernel=True).float(), want, atol=3e-2, rtol=2e-2)   # the engine's path
    assert ql.gemv16_fits(x, w)
    torch.testing.assert_close(linear(x, w, kernel=True, head=True).float(), want, atol=3e-2, rtol=2e-2)
