"""On a CUDA GPU: every byte a run allocates is one the memory plan counted, and the embedding table in
host memory (read by a kernel, inside the decode graphs too) generates what the table on the card does.
Skipped without a GPU; the GPU benchmark run executes this file."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ConfigError
from test_host_embedding import smallest_info_budget
from tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPE = dict(vocab_size=32000, hidden_size=512, moe_intermediate_size=256, num_experts=32, num_experts_per_tok=4,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
             max_position_embeddings=2048)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("gpu_memory"), "qwen3_moe", dtype=torch.bfloat16, **SHAPE)


def _prompts(n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n * 1000 + length)
    return [torch.randint(1, 30000, (length,), generator=g).tolist() for _ in range(n)]


def test_the_table_in_host_memory_generates_what_the_table_on_the_card_does(path) -> None:
    prompts = _prompts(3, 40)
    # the bus alone: the CPU's share (cold_experts auto) follows measured timings, which differ run to run
    with LLM(str(path), device="cuda", expert_pool_size="0%", embeddings="device", cold_experts="bus") as llm:
        assert not llm.engine.loaded.weights.embed_on_host
        want = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    with LLM(str(path), device="cuda", expert_pool_size="0%", cold_experts="bus") as llm:   # auto: on the host
        w = llm.engine.loaded.weights
        assert w.embed_on_host and w.embed.device.type == "cpu" and w.embed.is_pinned()
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
        m = llm.stats().memory
        assert m.resident_bytes == w.resident_bytes() and m.pinned_host_bytes >= w.embed.numel() * 2


@pytest.mark.parametrize("pool", ["0%", "50%"])
def test_a_run_allocates_no_more_than_the_plan_counts(path, pool) -> None:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with LLM(str(path), device="cuda", expert_pool_size=pool, max_batch=8, prefill_chunk=1024,
             kv_cache_size="256M", gpu_memory_budget="8G") as llm:
        llm.generate(_prompts(1, 1000), GREEDY)         # one long prefill chunk
        llm.generate(_prompts(8, 100), GREEDY)          # a batch of prefills, then decode steps
        m = llm.stats().memory
        counted = m.resident_bytes + m.expert_pool_bytes + m.kv_cache_bytes + m.kv_window_bytes + m.workspace_bytes
        peak = torch.cuda.max_memory_allocated() - base
        assert peak <= counted, (f"allocated {peak / 2**20:.0f} MiB, the plan counts {counted / 2**20:.0f} MiB "
                                 f"({m})")
        assert m.workspace_bytes < (1 << 30)            # sized to the steps, not a fixed gigabyte


def test_a_model_that_fits_only_with_the_table_in_host_memory_loads_so(path) -> None:
    budget = smallest_info_budget(path, "--embeddings", "host") + (1 << 20)    # the table is 31 MiB
    with pytest.raises(ConfigError, match="resident weights"):
        LLM(str(path), device="cuda", gpu_memory_budget=budget, embeddings="device")
    with LLM(str(path), device="cuda", gpu_memory_budget=budget) as llm:
        assert llm.engine.loaded.weights.embed_on_host
        assert len(llm.generate(_prompts(1, 20), GREEDY)[0].token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize("options", [dict(expert_pool_size="0%"), dict(expert_pool_size="50%", prefetch_depth=2),
                                     dict()], ids=["no-pool", "half", "resident"])
def test_a_closed_engine_gives_its_memory_back(path, options) -> None:
    # Loading a second model in the same process (the workbench's Open, a benchmark's next row) finds
    # the card as the first one found it: the closed engine is collected and nothing it allocated stays
    # (cuBLAS's workspace for a stream, made once per process, may).
    import gc
    import weakref
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with LLM(str(path), device="cuda", max_batch=8, kv_cache_size="256M", **options) as llm:
        llm.generate(_prompts(1, 300), GREEDY)
        llm.generate(_prompts(8, 40), GREEDY)           # decode graphs of several sizes
        engine = weakref.ref(llm.engine)
    torch.cuda.synchronize()
    # closed but still referenced (a variable the next load rebinds only once it returns): freed already
    kept = torch.cuda.memory_allocated() - base
    assert kept <= 64 << 20, f"{kept / 2**20:.0f} MiB stay allocated by a closed engine still referenced"
    del llm
    gc.collect()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    live = [] if engine() is None else [type(r).__name__ for r in gc.get_referrers(engine())][:8]
    assert engine() is None, f"the closed engine is still referenced by {live}"
    assert held <= 64 << 20, f"{held / 2**20:.0f} MiB stay allocated after the engine closed"


def test_engines_opened_and_closed_in_turn_do_not_accumulate_memory(path) -> None:
    # A benchmark's rows or a user opening model after model: what stays allocated after each close
    # (caches torch keeps per process, such as cuBLAS's workspace of a stream) does not grow per engine.
    # The card's own count (what nvidia-smi shows, the allocator's cache emptied) must not grow either.
    import gc
    held, card = [], []
    for pool in ("0%", "50%", "0%", "50%"):
        with LLM(str(path), device="cuda", max_batch=8, kv_cache_size="256M", expert_pool_size=pool) as llm:
            llm.generate(_prompts(1, 300), GREEDY)
            llm.generate(_prompts(8, 40), GREEDY)
            llm.generate(_prompts(3, 40), GREEDY)         # one more step size: one more recording
        del llm
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        held.append(torch.cuda.memory_allocated())
        free, total = torch.cuda.mem_get_info()
        card.append(total - free)
    assert held[-1] - held[1] <= 16 << 20, f"MiB held after each close: {[round(h / 2**20) for h in held]}"
    assert card[-1] - card[1] <= 64 << 20, f"MiB the card counts after each close: {[round(c / 2**20) for c in card]}"
