"""Expert parallel on the CPU: two and three gloo processes, each holding every N-th expert of every
MoE layer, give one process's logits (float32 sums in another order: within 1e-5) and greedy outputs
for every family; live options reach every card; a card that dies ends the engine with one error."""
from __future__ import annotations

import os
import signal

import pytest

from engine import LLM
from engine.errors import ConfigError, PipelineError
from parallel_helpers import GREEDY, OPTIONS, PROMPTS, gone
from tiny_models import build_tiny_model, family_configs

FAMILIES = list(family_configs())
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {f: build_tiny_model(tmp_path_factory.mktemp(f"ep-{f}"), f) for f in FAMILIES}


@pytest.mark.parametrize("family,cards", [(f, 2) for f in FAMILIES] + [("qwen2_moe", 3), ("gpt_oss", 3)])
def test_cards_match_one_process(folders, family, cards):
    one = LLM(str(folders[family]), **OPTIONS)
    many = LLM(str(folders[family]), expert_parallel=cards, **OPTIONS)
    try:
        pids = many.engine.loaded.pipeline.pids
        assert len(pids) == cards - 1
        for a, b in zip(one.engine.score_batch(PROMPTS), many.engine.score_batch(PROMPTS)):
            assert (a - b).abs().max().item() <= 1e-5
        assert [o.token_ids for o in many.generate(PROMPTS, GREEDY)] == [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
        st, ref = many.stats(), one.stats()
        assert [s.rank for s in st.stages] == list(range(cards))
        # every card routed its own experts' tokens; together they are the one process's, expert by expert
        assert st.experts.activations == ref.experts.activations
        assert all(sum(map(sum, s.experts.activations)) > 0 for s in st.stages)
        e = len(ref.experts.activations[0])
        assert [len(s.experts.activations[0]) for s in st.stages] == [len(range(r, e, cards)) for r in range(cards)]
    finally:
        many.engine.close()
        one.engine.close()
    assert gone(pids)


def test_live_options_reach_every_card(folders):
    llm = LLM(str(folders["qwen3_moe"]), expert_parallel=2, **OPTIONS)
    try:
        before = [s.experts.pool_slots_total for s in llm.stats().stages]
        applied = llm.reconfigure(expert_pool_size="50%", prefetch_depth=1)
        assert "expert pool" in applied["expert_pool_size"]
        assert [s.experts.pool_slots_total for s in llm.stats().stages] == [n // 2 for n in before]
        assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == 16
    finally:
        llm.engine.close()


def test_a_killed_card_ends_the_engine_with_one_error(folders):
    llm = LLM(str(folders["mixtral"]), expert_parallel=2, **OPTIONS)
    pids = llm.engine.loaded.pipeline.pids
    try:
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(PipelineError, match=rf"^expert shard 1 of 2 \(experts 1, 3, \.\.\.\) \(process {pids[0]}\) "
                                                r"ended unexpectedly \(killed by SIGKILL\); every stage was stopped"):
            llm.generate(PROMPTS, GREEDY)
    finally:
        llm.engine.close()
    assert gone(pids)


def test_settings_that_do_not_fit_are_refused(folders):
    with pytest.raises(ConfigError, match=r"^expert_parallel=5 needs at least one expert per card but each MoE layer "
                                          r"has 4; use --expert-parallel 4 or fewer$"):
        LLM(str(folders["mixtral"]), expert_parallel=5, **OPTIONS)
    with pytest.raises(ConfigError, match="cannot be combined yet; choose one of them"):
        LLM(str(folders["mixtral"]), expert_parallel=2, pipeline_parallel=2, **OPTIONS)


def test_info_prints_each_cards_share(folders, capsys):
    from main import main
    assert main(["info", "--model", str(folders["qwen3_moe"]), "--expert-parallel", "3",
                 "--gpu-memory-budget", "4.5G"]) == 0
    out = capsys.readouterr().out
    assert "expert parallel over 3 GPUs" in out
    assert "  GPU 0: experts 0, 3, ... (3 of 8 per layer, " in out
    assert "  GPU 2: experts 2, 5, ... (2 of 8 per layer, " in out and "budget 1.50 GiB: pool 6/6 experts (100%)" in out


def test_the_parallel_benchmark_runs_its_settings(tmp_path):
    """benchmarks/bench_parallel.py --smoke: one card, a pipeline and expert parallel on CPU processes."""
    import json
    import subprocess
    import sys
    from tiny_models import ROOT
    out = tmp_path / "parallel.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_parallel.py"), "--smoke", "--dir",
                    str(tmp_path / "model"), "--batches", "2", "--tokens", "3", "--warmup", "1", "--prompt-len", "8",
                    "--out", str(out)], check=True, timeout=600, capture_output=True)
    result = json.loads(out.read_text())
    assert not result["errors"]
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"one", "pipeline", "experts"}
    assert rows["one"]["tokens"] == rows["pipeline"]["tokens"] == rows["experts"]["tokens"] == 6
    assert [len(rows[m]["per_card"]) for m in ("one", "pipeline", "experts")] == [1, 2, 2]
    assert rows["pipeline"]["speedup_vs_one_card"] > 0
