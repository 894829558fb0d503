"""On a CUDA GPU: decode steps replayed from CUDA graphs generate what the eager engine does.

Skipped without a GPU (CI has none); the GPU benchmark run executes this file. With an offloaded
expert pool a step is recorded piecewise (one graph per MoE layer boundary, the host resolving each
layer's experts in between), so these cases cover pool sizes, prefetch depths, batch sizes that pad
up to a graph bucket, and live resizes that must drop the recordings.
"""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from test_experts_support import generate_with_resizes
from tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [1, 99, 4], [1, 250, 251, 252, 17]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe_gpu"), "qwen3_moe")
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=False) as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        info = llm.engine.loaded
        keys = info.spec.num_moe_layers * info.spec.num_experts
        nbytes = info.layout.nbytes
    return path, ref, keys, nbytes


def _graphs(llm: LLM):
    return llm.engine.runner.graphs


@pytest.mark.parametrize("frac", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("depth", [0, 2])
def test_graph_replay_matches_eager(model, frac, depth) -> None:
    # Three prompts pad up to the bucket of 4: padding rows must neither change the real rows nor
    # pull experts over the bus. frac 1.0 records a whole step as one graph, the others piecewise.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=int(frac * keys) * nbytes,
             prefetch_depth=depth) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        graphs = _graphs(llm)
        assert graphs.replays > 0
        rec = graphs.graphs[4]
        assert (len(rec.cuts) == 0) == (frac == 1.0)
        if frac < 1.0:
            assert len(rec.graphs) == len(rec.cuts) + 1 == llm.engine.loaded.spec.num_moe_layers + 1


def test_single_sequence_and_live_resize(model) -> None:
    # One prompt at a time (bucket 1, no padding), then resizes between steps: the recordings made
    # against the old pool must be dropped and re-made.
    path, ref, keys, nbytes = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=(keys // 2) * nbytes,
             prefetch_depth=2) as llm:
        assert llm.generate([PROMPTS[1]], GREEDY)[0].token_ids == ref[1]
        out, _ = generate_with_resizes(llm, PROMPTS, GREEDY, [0, keys, 3, keys // 2], nbytes)
        assert out == ref
        assert _graphs(llm).replays > 0
