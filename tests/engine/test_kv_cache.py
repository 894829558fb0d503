"""KV cache storage formats: int8 / fp8 rows with per-token scales, and live conversion between formats."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.engine import LLMEngine
from engine.config import EngineConfig
from engine.kv.cache import KVCache
from tiny_models import build_tiny_model


@pytest.mark.parametrize("fmt,bound", [("int8", 0.01), ("fp8", 0.07), ("bf16", 0.005)])
def test_rows_round_trip_within_the_format_error(fmt, bound):
    cache = KVCache(2, 4, 4, 2, 16, torch.float32, torch.device("cpu"), fmt)
    k, v = torch.randn(5, 2, 16), torch.randn(5, 2, 16) * 30          # scales differ per token and head
    slots = torch.tensor([3, 0, 9, 15, 7])
    cache.write(1, slots, k, v)
    gk, gv = cache.gather(1, slots)
    assert gk.dtype == torch.float32
    for got, want in ((gk, k), (gv, v)):
        assert (got - want).norm() / want.norm() < bound


def test_quantised_cache_is_smaller():
    full = KVCache.bytes_per_token(4, 2, 64, torch.bfloat16, "auto")
    assert KVCache.bytes_per_token(4, 2, 64, torch.bfloat16, "int8") < 0.6 * full


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("kv") / "m", "qwen3_moe")


@pytest.mark.parametrize("fmt,min_cos", [("int8", 0.9999), ("fp8", 0.999)])
def test_logits_with_a_quantised_cache_stay_close(model_dir, fmt, min_cos):
    ids = [1, 5, 77, 300, 12, 9, 400, 33, 41, 7]
    ref = LLM(str(model_dir), device="cpu").score(ids)
    got = LLM(str(model_dir), device="cpu", kv_cache_dtype=fmt, prefill_chunk=3).score(ids)   # chunks read the cache
    assert torch.nn.functional.cosine_similarity(got, ref, dim=-1).min() >= min_cos


def test_live_conversion_keeps_running_requests_going(model_dir):
    """Switch the format between steps: the request keeps its context and finishes; stats say the new format."""
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    want = LLM(str(model_dir), device="cpu").generate([[1, 5, 9, 11]], params)[0].token_ids
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    eng.add_request("r", [1, 5, 9, 11], params)
    ids = []
    for _ in range(6):
        ids += [t for d in eng.step() for t in d.new_token_ids]
    applied = eng.reconfigure(kv_cache_dtype="int8")
    assert "int8" in applied["kv_cache_dtype"] and eng.stats().kv_cache_dtype == "int8"
    while eng.has_unfinished():
        ids += [t for d in eng.step() for t in d.new_token_ids]
    assert len(ids) == 20 and ids[:6] == want[:6]
    assert sum(a == b for a, b in zip(ids, want)) >= 16        # int8 rows: the same text, give or take a flip
    eng.reconfigure(kv_cache_dtype="auto")
    assert eng.stats().kv_cache_dtype == "float32"


def test_a_model_without_window_layers_keeps_one_pool(model_dir):
    """No sliding-window layer: one pool, every layer at full size, no window tables anywhere."""
    eng = LLMEngine(EngineConfig(model=str(model_dir), device="cpu"))
    m = eng.loaded
    s, cache = m.spec, m.cache
    assert cache.window_blocks == 0 and not any(cache.windowed(i) for i in range(s.num_layers))
    assert all(k.shape == cache.shape for k in cache.k + cache.v)
    per_token = KVCache.bytes_per_token(s.num_layers, s.num_kv_heads, s.head_dim, m.dtype)
    assert cache.nbytes == cache.num_blocks * cache.block_size * per_token
    assert eng.scheduler.windows is None
    eng.add_request("r", [1, 5, 9], SamplingParams(max_tokens=2, temperature=0.0))
    sched = eng.scheduler.schedule()
    assert m.runner.build_batch(sched).window is None and sched.seqs[0].request.window_blocks == []


def test_window_layers_without_a_window_pool_stay_in_the_shared_pool():
    cache = KVCache(3, 4, 4, 2, 8, torch.float32, torch.device("cpu"), window_layers=(0, 2), window_blocks=0)
    assert cache.window_blocks == 0 and not cache.windowed(0)
    assert all(k.shape == (16, 2, 8) for k in cache.k)
