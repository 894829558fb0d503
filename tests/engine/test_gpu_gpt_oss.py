"""On a CUDA GPU: gpt-oss through the Triton kernels (sink and window attention in decode and
prefill, MXFP4 / int4 experts with biases and the clamped SwiGLU, the window-layer KV pool, CUDA
graphs, direct reads of missing experts) computes what the torch reference path computes on the CPU.

Skipped without a GPU (CI has none); the GPU benchmark run executes this file. fp32 activations
(the prefill MoE kernels use TF32 on a GPU, so logits are compared with a tolerance and greedy
tokens between GPU configurations, which share that arithmetic).
"""
from __future__ import annotations

import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from test_gpt_oss_mxfp4 import ship_as_mxfp4
from tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

_gen = torch.Generator().manual_seed(3)
# longer than the tiny model's window of 8, shorter than it, and one that fills several KV blocks
PROMPTS = [[1] + torch.randint(4, 500, (47,), generator=_gen).tolist(), [1, 99, 4],
           [1] + torch.randint(4, 500, (20,), generator=_gen).tolist()]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
TOL = {"atol": 3e-2, "rtol": 3e-2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    dense = build_tiny_model(tmp_path_factory.mktemp("oss") / "dense", "gpt_oss")
    shipped = ship_as_mxfp4(shutil.copytree(dense, tmp_path_factory.mktemp("oss") / "mxfp4"))
    return {"dense": dense, "mxfp4": shipped}


def _scores(path, **kw) -> list[torch.Tensor]:
    with LLM(str(path), dtype="float32", **kw) as llm:
        return [t.float().cpu() for t in llm.engine.score_batch(PROMPTS)]


def _greedy(path, **kw) -> list[list[int]]:
    with LLM(str(path), dtype="float32", **kw) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("kind", ["dense", "mxfp4"])
def test_prefill_logits_on_the_gpu_match_the_cpu(folders, kind) -> None:
    # chunked prefill (chunk 5 < window 8 < prompt 48): the prefill kernel's causal offset and window
    ref = _scores(folders[kind], device="cpu", prefill_chunk=5, max_batch_tokens=8, max_batch=4)
    got = _scores(folders[kind], device="cuda", prefill_chunk=5, max_batch_tokens=8, max_batch=4, cuda_graphs=False)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, **TOL)


@pytest.mark.parametrize("kind", ["dense", "mxfp4"])
def test_decode_on_the_gpu_follows_the_cpu(folders, kind) -> None:
    # the decode kernel with sinks and a window over the window pool; the first tokens agree with
    # the CPU reference (later ones may part where TF32 breaks a near tie)
    ref = _greedy(folders[kind], device="cpu")
    got = _greedy(folders[kind], device="cuda", cuda_graphs=False)
    assert [g[:4] for g in got] == [r[:4] for r in ref]


@pytest.mark.parametrize("kind, fmt", [("dense", "auto"), ("mxfp4", "auto"), ("dense", "int4")])
@pytest.mark.parametrize("frac, depth", [(1.0, 0), (0.5, 2), (0.0, 0)])
def test_graphs_pools_and_direct_reads_give_the_eager_tokens(folders, kind, fmt, frac, depth) -> None:
    kw = {"device": "cuda", "weight_format": fmt}
    if fmt == "int4":
        kw["group_size"] = 32
    eager = _greedy(folders[kind], cuda_graphs=False, **kw)
    with LLM(str(folders[kind]), dtype="float32", cuda_graphs=True, **kw) as probe:
        m = probe.engine.loaded
        keys, nbytes = m.spec.num_moe_layers * m.spec.num_experts, m.layout.nbytes
        assert m.layout.fmt == ("int4" if fmt == "int4" else kind if kind == "mxfp4" else "fp32")
    pool = None if frac == 1.0 else int(frac * keys) * nbytes
    with LLM(str(folders[kind]), dtype="float32", cuda_graphs=True, expert_pool_size=pool,
             prefetch_depth=depth, **kw) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == eager
        assert llm.engine.runner.graphs.replays > 0
        assert llm.engine.loaded.cache.window_nbytes > 0       # the window layers' own pool is in use
