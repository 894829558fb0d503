"""On a CUDA GPU: missing experts computed by the host CPU (cold_experts cpu / auto) generate what
the bus alone does. Skipped without a GPU; the GPU benchmark run executes this file."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from test_experts_support import generate_with_changes
from tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [1, 99, 4], [1, 250, 251, 252, 17]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe_cold"), "qwen3_moe")
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=False) as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        info = llm.engine.loaded
        keys = info.spec.num_moe_layers * info.spec.num_experts
        nbytes = info.layout.nbytes
    return path, ref, keys, nbytes


@pytest.mark.parametrize("frac", [0.0, 0.5])
@pytest.mark.parametrize("depth", [0, 2])
@pytest.mark.parametrize("mode", ["cpu", "auto"])
def test_cpu_experts_match_the_bus(model, frac, depth, mode) -> None:
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=int(frac * keys) * nbytes,
             prefetch_depth=depth, cold_experts=mode) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
        assert st.misses > 0
        if mode == "cpu":
            assert st.cpu_experts == st.misses and st.direct_bytes == 0 and st.cpu_ms > 0


def test_cold_experts_switch_live(model) -> None:
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=0, prefetch_depth=2,
             cold_experts="bus") as llm:
        modes = ["cpu", "bus", "auto"]
        out, _ = generate_with_changes(llm, PROMPTS, GREEDY, lambda s: {"cold_experts": modes[s % 3]})
        assert out == ref
        assert llm.stats().experts.cpu_experts > 0


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("batch", [1, 3])
def test_replayed_steps_give_the_cpu_its_share(tmp_path_factory, fmt, batch) -> None:
    # Replayed direct-read steps (depth 2, graphs on): with cpu every missing expert of a decode step
    # is computed by the host inside the replay; greedy output equals the bus alone, and the bus
    # carries no direct reads then.
    path = build_tiny_model(tmp_path_factory.mktemp(f"cold_graph_{fmt}"), "qwen3_moe")
    prompts = PROMPTS[:batch]
    outs, stats = {}, {}
    for mode in ("bus", "cpu", "auto"):
        group = {"group_size": 32} if fmt == "int4" else {}               # the tiny model's FFN is 64 wide
        with LLM(str(path), device="cuda", dtype="float32", weight_format=fmt, expert_pool_size=0,
                 prefetch_depth=2, cold_experts=mode, **group) as llm:
            outs[mode] = [o.token_ids for o in llm.generate(prompts, GREEDY)]
            stats[mode] = llm.stats().experts
            assert llm.engine.runner.graphs.replays > 0
    assert outs["cpu"] == outs["bus"] and outs["auto"] == outs["bus"]
    assert stats["cpu"].cpu_experts == stats["cpu"].misses and stats["cpu"].direct_bytes == 0
    assert stats["bus"].cpu_experts == 0 and stats["bus"].direct_bytes > 0
