"""Pipeline parallel on the CPU: two and three gloo processes give the logits and greedy outputs of one
process for every family, live options reach every stage, and a stage that dies or fails to load ends
the pipeline with one clear error and leaves no process behind."""
from __future__ import annotations

import dataclasses
import os
import re
import signal

import pytest
import torch

from engine import LLM
from engine.checkpoint.spec import read_spec
from engine.errors import ConfigError, ModelLoadError, PipelineError
from engine.parallel.plan import plan_pipeline
from parallel_helpers import GREEDY, OPTIONS, PROMPTS, alive, children, gone
from tiny_models import ROOT, build_tiny_model, family_configs

FAMILIES = list(family_configs())
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {f: build_tiny_model(tmp_path_factory.mktemp(f"pp-{f}"), f) for f in FAMILIES}


def _same_as_one_process(folder, stages: int) -> None:
    one = LLM(str(folder), **OPTIONS)
    many = LLM(str(folder), pipeline_parallel=stages, **OPTIONS)
    try:
        pids = many.engine.loaded.pipeline.pids
        assert len(pids) == stages - 1 and all(alive(p) for p in pids)
        for a, b in zip(one.engine.score_batch(PROMPTS), many.engine.score_batch(PROMPTS)):
            assert torch.equal(a, b)
        # batched greedy decoding with chunked prefill, through the scheduler of the first stage
        assert [o.token_ids for o in many.generate(PROMPTS, GREEDY)] == [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
        st = many.stats()
        assert [s.rank for s in st.stages] == list(range(stages))
        assert st.stages[0].first_layer == 0 and st.stages[-1].end_layer == read_spec(folder).num_layers
        assert all(a.end_layer == b.first_layer for a, b in zip(st.stages, st.stages[1:]))
        # the model's counters are the stages' together, layer by layer
        assert st.experts.hits + st.experts.misses == sum(s.experts.hits + s.experts.misses for s in st.stages) > 0
        assert len(st.experts.per_layer_hit_rate) == read_spec(folder).num_moe_layers
        assert st.memory.kv_cache_bytes == sum(s.memory.kv_cache_bytes for s in st.stages)
        # as much context as one process: a stage of window layers only puts no limit on the blocks
        assert st.kv_blocks_total == one.stats().kv_blocks_total
        # every link was used once at load, down the stages and back, before the first step
        assert many.engine.loaded.pipeline.warmed_edges == (*((r, r + 1) for r in range(stages - 1)), (stages - 1, 0))
    finally:
        many.engine.close()
        one.engine.close()
    assert gone(pids)


@pytest.mark.parametrize("family", FAMILIES)
def test_two_stages_match_one_process(folders, family):
    _same_as_one_process(folders[family], 2)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_three_stages_match_one_process(folders, family):
    """gpt-oss's window layers land in stages 0 and 2 only: the block tables of its window pool reach
    them, and its full-attention blocks are as many as stage 1 (its full layer) can hold."""
    _same_as_one_process(folders[family], 3)


def _stage_claims(folder, config, budget):
    """Each stage's KV claim for the tiny model in ``folder`` split over 3 stages, planned on ``budget``."""
    from engine.kv.sizing import kv_sizing
    from engine.memory import plan_memory
    from engine.parallel.stages import stage_claim, stage_spec
    spec = read_spec(folder)
    context = config.max_model_len or spec.max_position
    claims = []
    for s in plan_pipeline(spec, 3, 4, "bf16", 1 << 10).stages:
        kv = kv_sizing(stage_spec(spec, s), torch.float32, "auto", context, config.max_batch, config.token_budget, 16)
        plan = plan_memory(0, 1 << 10, 4, kv.bytes_per_token, budget, workspace_bytes=0, min_kv_tokens=0,
                           window_kv_bytes=kv.window_pool_bytes)
        claims.append(stage_claim(plan, context, config.max_batch, 16, None))
    return claims


def test_a_stage_of_window_layers_only_claims_no_limit_on_the_kv_blocks(folders):
    from engine.config import EngineConfig
    from engine.parallel.stages import NO_LIMIT, agree_kv
    config = EngineConfig(model=str(folders["gpt_oss"]), **OPTIONS)        # layers: window 8, full, window 8
    claims = _stage_claims(folders["gpt_oss"], config, None)
    assert [c.blocks == NO_LIMIT for c in claims] == [True, False, True]
    # on the CPU (no budget) the full-attention stage holds a full batch at the full context
    assert claims[1].blocks == 4 * 512 // 16
    assert agree_kv(claims, 512, False, 16).blocks == claims[1].blocks
    assert agree_kv([claims[0], claims[2]], 512, False, 16).blocks == 32     # no full layer anywhere: one sequence
    # windows as long as the context are kept in the full pool: every stage's blocks are a real limit
    assert all(c.blocks != NO_LIMIT for c in _stage_claims(folders["gpt_oss"], config.replace(max_model_len=8), None))


def test_the_card_with_the_least_kv_room_sets_the_context(folders):
    """On a budget the stages agree on the fewest blocks a card holds, and the context follows the rule
    of one card (engine.memory.fit_context) on that card: capped when unset, refused when set, named."""
    from engine.config import EngineConfig
    from engine.memory import plan_memory
    from engine.parallel.stages import NO_LIMIT, KVClaim, agree_kv, stage_claim
    per_token = 1024
    room = lambda blocks: KVClaim(blocks, blocks * 16 * per_token, per_token, 1 << 30)   # noqa: E731 — a 1G card
    free = KVClaim(NO_LIMIT, 0, 0, None)
    agreed = agree_kv([room(100), room(40), free], 2048, False, 16)
    assert (agreed.blocks, agreed.context) == (40, 640)
    assert agreed.note == ("context length 640 tokens (the model allows 2048): that is what the KV cache the 1.00 GiB "
                           "budget of GPU 1 leaves holds; lower --expert-pool-size or raise --gpu-memory-budget for a "
                           "longer one")
    with pytest.raises(ConfigError, match=r"^a context of 2048 tokens needs 2.00 MiB of KV cache but the 1.00 GiB GPU "
                                          r"memory budget of GPU 1 leaves it 640.00 KiB; lower --max-model-len to 640 "
                                          r"or lower --expert-pool-size or raise --gpu-memory-budget$"):
        agree_kv([room(100), room(40), free], 2048, True, 16)
    with pytest.raises(ConfigError, match="budget of GPU 2 leaves it 0 B; lower --expert-pool-size or raise"):
        agree_kv([room(100), free, room(0)], 2048, False, 16)          # not one block: no context fits
    # room for the whole context: unchanged, no note
    assert agree_kv([room(200), room(128)], 2048, True, 16) == agree_kv([room(128)], 2048, True, 16)
    assert agree_kv([room(128)], 2048, True, 16).context == 2048
    # the room a plan leaves, as the engine's stages and info claim it: a full batch at full context at most
    config = EngineConfig(model=str(folders["gpt_oss"]), **OPTIONS)
    plan = plan_memory(0, 1 << 10, 4, per_token, 64 << 20, workspace_bytes=0, min_kv_tokens=0)
    assert stage_claim(plan, 512, config.max_batch, 16, None) == KVClaim(128, 4 * 512 * per_token, per_token, 64 << 20)
    tight = plan_memory(0, 1 << 10, 4, per_token, 4 * (1 << 10) + 100 * per_token, workspace_bytes=0, min_kv_tokens=0)
    assert stage_claim(tight, 512, 4, 16, None).blocks == 6                 # 100 tokens: 6 whole blocks
    assert stage_claim(tight, 512, 4, 16, 8 * per_token).blocks == 32       # a KV size given: one sequence at least


def test_a_stage_loads_with_the_context_the_stages_agreed_on(folders):
    """The first stage of a CPU pipeline, loaded beside a card whose budget holds 3 blocks: its context
    and its cache are the agreed ones, and a context set longer than that is refused, naming the card."""
    from engine.checkpoint.reader import SafetensorsReader
    from engine.config import EngineConfig
    from engine.loading import LoadedModel
    from engine.parallel.stages import KVClaim, StageContext, StageSource, stage_spec
    folder = folders["qwen3_moe"]
    spec = read_spec(folder)
    plan = plan_pipeline(spec, 2, 4, "bf16", 1 << 10)
    first = plan.stages[0]
    peer = KVClaim(3, 3 * 16 * 4096, 4096, 1 << 30)

    def load(**options):
        config = EngineConfig(model=str(folder), **{**OPTIONS, **options})
        ctx = StageContext(spec, plan, 0, lambda own: [own, peer])
        return LoadedModel(config, stage_spec(spec, first), StageSource(SafetensorsReader(folder), first), None,
                           folder, (), stage=ctx)

    loaded = load()
    try:
        assert loaded.max_model_len == 48 and loaded.cache.num_blocks == 3 + 1     # + the scratch block
        assert any(n.startswith("context length 48 tokens (the model allows 512): that is what the KV cache the "
                                "1.00 GiB budget of GPU 1 leaves holds") for n in loaded.info.notes)
    finally:
        loaded.close()
    with pytest.raises(ConfigError, match=r"^a context of 100 tokens needs .* budget of GPU 1 leaves it .*; lower "
                                          r"--max-model-len to 48 or lower --expert-pool-size or raise "
                                          r"--gpu-memory-budget$"):
        load(max_model_len=100)


def test_more_stages_than_moe_layers_is_refused(folders):
    # qwen2_moe's tiny model has a dense layer between its two sparse ones
    with pytest.raises(ConfigError, match=r"^pipeline_parallel=3 needs at least one MoE layer per stage but the "
                                          r"model has 2; use --pipeline-parallel 2 or fewer$"):
        LLM(str(folders["qwen2_moe"]), pipeline_parallel=3, **OPTIONS)


def test_live_options_reach_every_stage(folders):
    one = LLM(str(folders["qwen3_moe"]), **OPTIONS)
    many = LLM(str(folders["qwen3_moe"]), pipeline_parallel=2, **OPTIONS)
    try:
        before = [s.experts.pool_slots_total for s in many.stats().stages]
        change = dict(expert_pool_size="50%", prefetch_depth=0, kv_cache_dtype="int8")
        applied = many.reconfigure(**change)
        one.reconfigure(**change)
        assert "stage 1: expert pool" in applied["expert_pool_size"]
        st = many.stats()
        assert [s.experts.pool_slots_total for s in st.stages] == [n // 2 for n in before]
        assert all(s.experts.pool_slots_total > 0 for s in st.stages)
        assert st.kv_cache_dtype == "int8"
        # both run the changed settings alike: quantised KV on every stage, half the experts pooled
        for a, b in zip(one.engine.score_batch(PROMPTS), many.engine.score_batch(PROMPTS)):
            assert torch.equal(a, b)
        assert [o.token_ids for o in many.generate(PROMPTS, GREEDY)] == [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
    finally:
        many.engine.close()
        one.engine.close()


def test_a_killed_stage_ends_the_pipeline_with_one_error(folders):
    llm = LLM(str(folders["mixtral"]), pipeline_parallel=3, **OPTIONS)
    pids = llm.engine.loaded.pipeline.pids
    try:
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(PipelineError) as err:
            llm.generate(PROMPTS, GREEDY)
        text = str(err.value)
        assert "\n" not in text
        assert text.startswith(f"pipeline stage 1 of 3 (layers 1) (process {pids[0]}) ended unexpectedly "
                               "(killed by SIGKILL)"), text
        assert text.endswith("every stage was stopped — load the model again")
        assert gone(pids)                       # the stage after it was stopped too, not left waiting
        with pytest.raises(PipelineError, match="ended unexpectedly"):   # and the engine says so from then on
            llm.generate([[1, 2, 3]], GREEDY)
    finally:
        llm.engine.close()
    assert gone(pids)


def test_a_stage_that_cannot_load_gives_its_error_and_stops_the_others(folders, tmp_path):
    """A tensor of a later stage's layer missing: that stage's one-line load error, and nothing left running."""
    from safetensors.torch import load_file, save_file
    src = folders["olmoe"]
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.2.self_attn.o_proj.weight"]
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    before = children()
    with pytest.raises(ModelLoadError, match=r"^pipeline stage 1 of 2 \(layers 1-2\): tensor "
                                             r"'model.layers.1.self_attn.o_proj.weight'"):
        LLM(str(bad), pipeline_parallel=2, **OPTIONS)
    assert gone(list(children() - before))


def test_plan_balances_the_bytes_each_card_holds(folders):
    spec = dataclasses.replace(read_spec(folders["mixtral"]), num_layers=12, moe_layers=(True,) * 12)
    plan = plan_pipeline(spec, 2, 2, "bf16", 1 << 20)
    a, b = plan.stages
    assert (a.start, a.end, b.start, b.end) == (0, a.end, a.end, 12)
    layer = b.resident_bytes // (b.end - b.start) + spec.num_experts * (1 << 20)     # one layer's bytes
    # the first stage also holds the embedding and the LM head; the split evens out the bytes to a layer
    assert abs((a.resident_bytes + a.expert_bytes) - (b.resident_bytes + b.expert_bytes)) <= layer
    assert a.moe_start == 0 and b.moe_start == a.moe_layers and a.moe_layers + b.moe_layers == 12
    # a card with twice the budget takes about twice the layers
    lopsided = plan_pipeline(spec, 2, 2, "bf16", 1 << 20, (1 << 30, 2 << 30))
    assert lopsided.stages[1].end - lopsided.stages[1].start == 8
    assert plan.pool_fraction(0) + plan.pool_fraction(1) == pytest.approx(1.0)


def test_info_prints_the_plan_per_card(folders, capsys):
    from main import main
    assert main(["info", "--model", str(folders["qwen3_moe"]), "--pipeline-parallel", "2",
                 "--gpu-memory-budget", "1.5G,1.25G"]) == 0
    out = capsys.readouterr().out
    assert "pipeline over 2 GPUs" in out
    assert "stage 0 (GPU 0): layers 0 (1 layer, 1 MoE), resident " in out and "with embedding and LM head" in out
    assert "stage 1 (GPU 1): layers 1-2 (2 layers, 2 MoE)" in out
    assert "GPU 0 (layers 0, budget 1.50 GiB):" in out and "GPU 1 (layers 1-2, budget 1.25 GiB):" in out
    agreed = re.search(r"KV context        : every card keeps the same ([0-9,]+) blocks of 16", out)
    # each card's plan shows the KV cache it allocates, those blocks, not all the budget would leave it
    tokens = [int(t) for t in re.findall(r"  KV cache          : [\d.]+ [KMG]iB = (\d+) tokens", out)]
    assert agreed and tokens == [int(agreed.group(1).replace(",", "")) * 16] * 2
    assert out.count("(the blocks every card keeps; the budget would leave it ") == 2


def test_info_prints_the_kv_context_the_stages_agree_on(folders, capsys):
    """gpt-oss's tiny model over 3 cards: layers 0 and 2 are sliding-window layers, layer 1 a full one."""
    from main import main
    oss = str(folders["gpt_oss"])
    # GPU 1's budget leaves room for few tokens; GPU 0's and GPU 2's hold no full-attention layer to limit them
    assert main(["info", "--model", oss, "--pipeline-parallel", "3", "--gpu-memory-budget", "80M,72M,80M"]) == 0
    out = capsys.readouterr().out
    gpu_1 = out.split("GPU 1 (layers 1, ")[1]
    room = int(re.search(r"KV cache\s+: .* = (\d+) tokens\n", gpu_1).group(1))
    blocks = room // 16                          # whole blocks of 16 tokens
    assert 32 < blocks < 512                     # more than one sequence's, less than a full batch's
    assert (f"KV context        : every card keeps the same {blocks:,} blocks of 16, so the pipeline holds "
            f"{blocks * 16:,} tokens of context") in out
    assert "GPU 0 and GPU 2 hold only sliding-window layers" in out and "has room for" not in out
    # room for more than a full batch at full context: the blocks the engine's own stages agree on
    assert main(["info", "--model", oss, "--pipeline-parallel", "3", "--gpu-memory-budget", "3G",
                 "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    llm = LLM(oss, pipeline_parallel=3, device="cpu", dtype="float32")
    try:
        agreed = llm.engine.loaded.cache.num_blocks - 1          # less the scratch block
    finally:
        llm.engine.close()
    assert f"every card keeps the same {agreed:,} blocks of 16, so the pipeline holds {agreed * 16:,} tokens" in out


def test_budget_per_card_is_checked():
    from engine.config import EngineConfig
    c = EngineConfig(model="m", pipeline_parallel=2, gpu_memory_budget="24G,20G")
    assert c.gpu_memory_budget == (24 << 30, 20 << 30)
    with pytest.raises(ConfigError, match=r"^gpu_memory_budget lists 3 sizes for 2 GPUs; give one "
                                          r"size per GPU \(e.g. 24G,24G\) or one size for all of them$"):
        EngineConfig(model="m", pipeline_parallel=2, gpu_memory_budget="1G,2G,3G")
    with pytest.raises(ConfigError, match="pipeline_parallel must be an integer >= 1"):
        EngineConfig(model="m", pipeline_parallel=0)


def test_ctrl_c_shuts_every_stage_down(folders, tmp_path):
    """Ctrl-C reaches the whole process group: the stages ignore it, the engine's process stops them."""
    import subprocess
    import sys
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, time\n"
        "from engine import LLM\n"
        f"llm = LLM({str(folders['qwen3_moe'])!r}, pipeline_parallel=3, device='cpu', dtype='float32')\n"
        "print(*llm.engine.loaded.pipeline.pids, flush=True)\n"
        "while True:\n"
        "    time.sleep(0.1)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
        assert "KeyboardInterrupt" in proc.stderr.read()
        assert gone(pids + [proc.pid])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("family,stages,groups", [("qwen3_moe", 2, 2), ("gpt_oss", 3, 3)])
def test_micro_batches_give_the_same_outputs(folders, family, stages, groups):
    """A step's sequences sent down the stages in groups: the same greedy outputs as one process."""
    one = LLM(str(folders[family]), **OPTIONS)
    many = LLM(str(folders[family]), pipeline_parallel=stages, pipeline_microbatches=groups, **OPTIONS)
    pipeline = many.engine.loaded.pipeline
    split, sizes = pipeline._split, []
    pipeline._split = lambda batch, cache: sizes.append(len(out := split(batch, cache))) or out
    try:
        for a, b in zip(one.engine.score_batch(PROMPTS), many.engine.score_batch(PROMPTS)):
            assert (a - b).abs().max().item() <= 1e-5
        assert [o.token_ids for o in many.generate(PROMPTS, GREEDY)] == [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
        assert max(sizes) == groups               # the steps with enough sequences went down in groups
    finally:
        many.engine.close()
        one.engine.close()


def test_a_step_that_fails_on_the_first_stage_stops_the_pipeline(folders, monkeypatch):
    """The other stages were told to run the step: they are stopped, not left waiting, and the error is one line."""
    llm = LLM(str(folders["qwen3_moe"]), pipeline_parallel=2, **OPTIONS)
    pids = llm.engine.loaded.pipeline.pids
    model = llm.engine.loaded.model
    try:
        def broken(*args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        monkeypatch.setattr(model, "layers", broken)
        with pytest.raises(PipelineError, match=r"^the engine's own card failed during a step \(OutOfMemoryError: CUDA "
                                                r"out of memory. Tried to allocate 2.00 GiB\); every stage was stopped — "
                                                r"load the model again$"):
            llm.generate([[1, 2, 3]], GREEDY)
        assert gone(pids)
    finally:
        llm.engine.close()


def test_pool_size_in_bytes_applied_again_keeps_every_stages_share(folders):
    """The config keeps the whole model's size, so applying it again (a knob reset) changes nothing."""
    llm = LLM(str(folders["qwen3_moe"]), pipeline_parallel=2, **OPTIONS)
    try:
        first = [s.experts.pool_slots_total for s in llm.stats().stages]
        llm.reconfigure(expert_pool_size=llm.engine.config.expert_pool_size)
        llm.reconfigure(expert_pool_size=llm.engine.config.expert_pool_size)
        assert [s.experts.pool_slots_total for s in llm.stats().stages] == first
        # a second model over several GPUs in the same process is refused, and the first keeps running
        with pytest.raises(ConfigError, match="another model spread over several GPUs is loaded in this process"):
            LLM(str(folders["mixtral"]), pipeline_parallel=2, **OPTIONS)
        assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == 16
    finally:
        llm.engine.close()
