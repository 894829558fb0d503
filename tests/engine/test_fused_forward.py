"""The forward with its fused kernels (add + RMSNorm, q/k norm + RoPE + KV write, router) against the
plain-torch forward, on CPU through the Triton interpreter.

On CUDA the model uses the fused kernels for every step; here they are switched on by hand so the
wiring — which residual each norm adds, which cache rows the fused write fills, the router's ids —
is checked on the families whose attention the kernel covers (per-head q/k norm; qkv bias).
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors through the Triton interpreter (a GPU run uses test_gpu_decode)")
from engine import LLM, SamplingParams  # noqa: E402
from tiny_models import build_tiny_model  # noqa: E402

PROMPTS = [[1, 5, 77, 300, 12, 9], [1, 99, 4]]


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_fused_forward_matches_torch_forward(tmp_path, family) -> None:
    path = build_tiny_model(tmp_path / family, family)
    with LLM(str(path), device="cpu", dtype="float32") as llm:
        model = llm.engine.loaded.model
        assert not model.fused                      # CPU default: plain torch
        ref = llm.engine.score_batch(PROMPTS)
        greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        ref_tokens = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
        model.fused = True
        try:
            got = llm.engine.score_batch(PROMPTS)
            tokens = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
        finally:
            model.fused = False
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    assert tokens == ref_tokens


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_decode_attention_kernel_reads_a_quantised_cache(tmp_path, kv) -> None:
    # On CUDA an int8 / fp8 KV cache is read by the split-KV kernel with its per-token scales; here
    # the kernel is switched on by hand and must generate what the torch attention does.
    from kernels.paged_attention import paged_decode_attention
    path = build_tiny_model(tmp_path / "m", "qwen3_moe")
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with LLM(str(path), device="cpu", dtype="float32", kv_cache_dtype=kv) as llm:
        model = llm.engine.loaded.model
        ref = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
        calls = []

        def kernel(*args, **kw):
            calls.append(kw["k_scale"].dtype)
            return paged_decode_attention(*args, **kw)
        model.decode_attention = kernel
        try:
            got = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
        finally:
            model.decode_attention = None
    assert got == ref
    assert calls and set(calls) == {torch.float32}        # every decode layer went through the kernel
