"""On a CUDA GPU: a prefill layer that misses more experts than its staging slots hold runs in passes,
each pass's copies ordered after the kernels before it (the demand stream waits for the compute
stream), and generates what the resident model does, with the bus alone and with the host CPU's share.
Skipped without a GPU; the GPU benchmark run executes this file."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[1 + (7 * i) % 400 for i in range(96)], [3, 9, 27, 81, 243]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe_passes"), "qwen3_moe")
    with LLM(str(path), device="cuda", dtype="float32", cuda_graphs=False) as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    return path, ref


@pytest.mark.parametrize("depth", [0, 2])
@pytest.mark.parametrize("mode", ["bus", "auto"])
def test_prefill_in_passes_matches_the_resident_model(model, depth, mode) -> None:
    path, ref = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=0, prefetch_depth=depth,
             expert_reads="copy", cold_experts=mode, max_batch=1) as llm:
        experts = llm.engine.loaded.experts
        assert experts.r.books.staging < experts.r.num_experts
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
    assert st.extra_passes > 0 or (mode == "auto" and st.cpu_experts > 0)   # the CPU may take the overflow


def test_a_pass_copies_only_after_the_kernels_before_it(model) -> None:
    # each pass's kernels are held back on the GPU (a 20 ms spin before each), so a copy of the next
    # group not ordered after them would overwrite the experts they read and change the output
    path, ref = model
    with LLM(str(path), device="cuda", dtype="float32", expert_pool_size=0, prefetch_depth=0,
             expert_reads="copy", cold_experts="bus", max_batch=1, cuda_graphs=False) as llm:
        model_obj = llm.engine.loaded.model
        fast = model_obj.moe_fn

        def slow(*args, **kwargs):
            torch.cuda._sleep(20_000_000)
            return fast(*args, **kwargs)

        model_obj.moe_fn = slow
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        assert llm.stats().experts.extra_passes > 0
