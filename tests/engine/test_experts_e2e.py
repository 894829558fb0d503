"""The engine with an offloaded expert pool generates exactly what the fully resident engine does."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from test_experts_support import generate_with_resizes
from tiny_models import build_tiny_model

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [1, 99, 4], [1, 250, 251, 252, 17]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("qwen3_moe"), "qwen3_moe")
    llm = LLM(str(path), device="cpu", dtype="float32")
    ref = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    info = llm.engine.loaded
    keys = info.spec.num_moe_layers * info.spec.num_experts
    nbytes = info.layout.nbytes
    llm.close()
    return path, ref, keys, nbytes


def _llm(path, **kw) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", **kw)


# 0 slots (all staged), 1 slot (below one layer's active set), half, all but one
@pytest.mark.parametrize("frac", [0.0, "one", 0.5, "all-1"])
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_greedy_identical_for_pool_and_depth(model, frac, depth) -> None:
    path, ref, keys, nbytes = model
    slots = {"one": 1, "all-1": keys - 1}.get(frac) if isinstance(frac, str) else int(frac * keys)
    with _llm(path, expert_pool_size=slots * nbytes, prefetch_depth=depth) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
        assert st.pool_slots_total == slots and st.misses > 0


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_greedy_identical_per_policy(model, policy) -> None:
    path, ref, keys, nbytes = model
    with _llm(path, expert_pool_size=(keys // 4) * nbytes, prefetch_depth=1, expert_policy=policy) as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref


@pytest.mark.parametrize("reads", ["auto", "direct"])
def test_live_resizes_mid_generation(model, reads) -> None:
    # Pool sizes and depths (0-2) change between steps; with direct reads a step's carried staging
    # slots and admissions must survive each resize and each switch to copying (depth 0).
    path, ref, keys, nbytes = model
    with _llm(path, expert_pool_size=(keys // 2) * nbytes, prefetch_depth=2, expert_reads=reads) as llm:
        sizes = [0, keys, 3, keys // 2, 1]
        out, steps = generate_with_resizes(llm, PROMPTS, GREEDY, sizes, nbytes)
        assert out == ref
        assert steps > len(sizes)


# Missing experts read straight from the host store (on CPU both are RAM; the same bookkeeping as
# on a GPU: snapshots, staging prefetches, admissions at each step's end).
@pytest.mark.parametrize("frac", [0.0, "one", 0.5])
@pytest.mark.parametrize("depth", [1, 2])
def test_greedy_identical_with_direct_reads(model, frac, depth) -> None:
    path, ref, keys, nbytes = model
    slots = {"one": 1}.get(frac) if isinstance(frac, str) else int(frac * keys)
    with _llm(path, expert_pool_size=slots * nbytes, prefetch_depth=depth, expert_reads="direct") as llm:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        st = llm.stats().experts
        assert st.direct_bytes > 0 and st.misses > 0


def test_direct_reads_switched_live_mid_generation(model) -> None:
    path, ref, keys, nbytes = model
    with _llm(path, expert_pool_size=(keys // 2) * nbytes, prefetch_depth=2, expert_reads="direct") as llm:
        eng = llm.engine
        ids = {eng.add_request(None, p, GREEDY): i for i, p in enumerate(PROMPTS)}
        out = {i: [] for i in ids.values()}
        modes, step = ["copy", "direct", "auto"], 0
        while eng.has_unfinished():
            for o in eng.step():
                out[ids[o.request_id]] += o.new_token_ids
            llm.reconfigure(expert_reads=modes[step % 3])
            step += 1
        assert [out[i] for i in range(len(PROMPTS))] == ref
