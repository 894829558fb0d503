"""A prefill layer that misses more experts than there are staging slots runs in passes
(engine/experts/copy_path.LayerPasses): every missing expert crosses the bus once, and the output is
the resident model's."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.experts import copy_path
from tiny_models import build_tiny_model

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = [[1 + (7 * i) % 400 for i in range(48)], [3, 9, 27, 81, 243]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("passes"), "qwen3_moe")
    with LLM(str(path), device="cpu", dtype="float32") as llm:
        ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    return path, ref


def _count_passes(monkeypatch) -> list[int]:
    """Each layer run in passes: how many (the list fills as the engine runs)."""
    passes: list[int] = []
    runs = copy_path.LayerPasses.runs

    def counted(self, first_row):
        n = 0
        for got in runs(self, first_row):
            n += 1
            yield got
        passes.append(n)

    monkeypatch.setattr(copy_path.LayerPasses, "runs", counted)
    return passes


# no pool, so every miss needs a staging slot; at depth 2 the prefetches of later layers hold some too
@pytest.mark.parametrize("depth", [0, 2])
def test_a_layer_missing_more_experts_than_staging_runs_in_passes(model, depth, monkeypatch):
    path, ref = model
    passes = _count_passes(monkeypatch)
    with LLM(str(path), device="cpu", dtype="float32", expert_pool_size="0%", prefetch_depth=depth,
             expert_reads="copy", max_batch=1) as llm:
        experts = llm.engine.loaded.experts
        staging, E = experts.r.books.staging, experts.r.num_experts
        assert staging < E                                   # half a layer: a 48-token prefill misses more
        out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        experts.settle()                                     # every prefetch counted, used or wasted
        st, nb = llm.stats().experts, llm.engine.loaded.layout.nbytes
    assert out == ref
    assert passes and max(passes) >= 2 and st.extra_passes == sum(passes) - len(passes)
    # each missing expert crossed once, passes or not (and each prefetch, used or wasted, once more)
    assert st.h2d_bytes // nb == st.misses + st.prefetch_hits + st.prefetch_wasted


def test_each_card_of_expert_parallel_runs_its_share_in_passes(tmp_path):
    # two gloo processes, each with half the experts and no pool: a prefill chunk misses more of a
    # card's experts than its staging holds
    from parallel_helpers import GREEDY as EP_GREEDY
    from parallel_helpers import OPTIONS, PROMPTS as EP_PROMPTS
    path = build_tiny_model(tmp_path / "ep", "qwen3_moe")
    one = LLM(str(path), **OPTIONS)
    many = LLM(str(path), expert_parallel=2, expert_pool_size="0%", prefetch_depth=0, expert_reads="copy",
               **{**OPTIONS, "max_batch": 1})
    try:
        assert [o.token_ids for o in many.generate(EP_PROMPTS, EP_GREEDY)] == \
            [o.token_ids for o in one.generate(EP_PROMPTS, EP_GREEDY)]
        assert all(s.experts.extra_passes > 0 for s in many.stats().stages)     # every card ran passes
    finally:
        many.engine.close()
        one.engine.close()


def test_decode_steps_that_may_need_passes_run_eagerly(model):
    # staging sized at load for one sequence; a live change to 16 lets a copy-path decode step miss more
    # experts in a layer than staging holds: such a step runs eagerly (a recording computes a layer once)
    path, ref = model
    with LLM(str(path), device="cpu", dtype="float32", expert_pool_size="0%", prefetch_depth=0,
             expert_reads="copy", max_batch=1) as llm:
        experts = llm.engine.loaded.experts
        staging = experts.r.books.staging
        top_k = llm.engine.loaded.spec.top_k
        assert not experts.may_run_in_passes(1) and not experts.eager_for(1)
        llm.reconfigure(max_batch=16)
        big = -(-(staging + 1) // top_k)                 # tokens whose pairs can exceed the staging slots
        assert experts.may_run_in_passes(big) and experts.eager_for(big)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("batch", [2, 4])
def test_decode_steps_never_run_in_passes(model, depth, batch, monkeypatch):
    # staging holds a decode step's misses: prefetches for the layer that it does not use, and those for
    # later layers, give their slots to its misses first (a recorded step could not run in passes)
    path, ref = model
    sizes: list[int] = []
    init = copy_path.LayerPasses.__init__

    def noted(self, r, moe_index, ids, *rest):
        sizes.append(len(ids))
        init(self, r, moe_index, ids, *rest)

    monkeypatch.setattr(copy_path.LayerPasses, "__init__", noted)
    prompts = [[5 + (11 * i + j) % 300 for i in range(3)] for j in range(batch)]
    with LLM(str(path), device="cpu", dtype="float32", expert_pool_size="0%", prefetch_depth=depth,
             expert_reads="copy", max_batch=batch, prefill_chunk=batch) as llm:
        k, staging = llm.engine.loaded.spec.top_k, llm.engine.loaded.experts.r.books.staging
        with LLM(str(path), device="cpu", dtype="float32") as resident:
            want = [o.token_ids for o in resident.generate(prompts, GREEDY)]
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
    assert all(n > batch * k for n in sizes), (sizes, staging)  # only steps larger than a decode step
