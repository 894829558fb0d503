"""Engine options: sizes, shares of the experts, and one clear sentence for every bad value."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig, format_size, parse_size
from engine.options import PoolShare, parse_live, pool_bytes
from engine.errors import ConfigError


def test_sizes_parse_like_a_user_writes_them():
    assert parse_size("10G") == 10 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size(4096) == 4096 and parse_size(None) is None


@pytest.mark.parametrize("value", ["99999999999999999999G", "2000T", 1e30, 1 << 51])
def test_a_size_past_any_machines_memory_is_refused(value):
    # the number a user mistyped (or a plan's advice made of a broken config) is one line, not a plan of
    # petabytes or an overflow deep in torch
    with pytest.raises(ConfigError, match=r"is more memory than any machine has \(over 1 PiB\); give a size such as 24G"):
        parse_size(value, "kv_cache_size")
    assert parse_size("1024T") == 1 << 50


def test_a_size_that_is_not_a_number_is_refused():
    with pytest.raises(ConfigError, match="is not a size"):
        parse_size(float("nan"), "kv_cache_size")


def test_pool_share_resolves_against_all_experts():
    share = parse_live("expert_pool_size", "50%")
    assert share == PoolShare(50.0) and str(share) == "50%"   # kept until the expert bytes are known
    assert EngineConfig(model="m", expert_pool_size="50%").expert_pool_size == share
    assert pool_bytes(parse_live("expert_pool_size", "25%"), total_bytes=1000) == 250
    assert parse_live("expert_pool_size", "2M") == 2 << 20 and pool_bytes(2 << 20, total_bytes=1000) == 2 << 20


@pytest.mark.parametrize("options,message", [
    ({"expert_pool_size": "150%"}, "expert_pool_size='150%' is more than all the experts; give at most 100%"),
    ({"expert_pool_size": "-5%"}, "is not a share of the experts; write e.g. 50%"),
    ({"expert_pool_size": "ten gigs"}, "is not a size; write bytes or a number with K, M, G or T"),
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype='int3' is not supported; choose one of auto, bf16, int8, fp8"),
    ({"group_size": 48}, "group_size=48 is not supported; choose 32, 64 or 128"),
    ({"max_batch": 8, "max_batch_tokens": 4}, "raise max_batch_tokens or lower max_batch"),
    ({"device": "tpu"}, "device='tpu' is not supported; use auto, cpu, cuda or cuda:N"),
    ({"expert_policy": "static"}, "expert_policy=static needs routing_profile=FILE"),
])
def test_bad_options_say_what_to_do(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        EngineConfig(model="m", **options)


def test_engine_config_reads_pool_share_in_bytes(tmp_path):
    from engine import LLM
    from tiny_models import build_tiny_model
    llm = LLM(str(build_tiny_model(tmp_path / "m", "mixtral")), device="cpu", expert_pool_size="50%")
    total = 3 * 4 * llm.engine.loaded.layout.nbytes            # 3 MoE layers x 4 experts
    assert llm.engine.config.expert_pool_size == total // 2
    assert llm.stats().experts.pool_slots_total == 6
    llm.reconfigure(expert_pool_size="25%")
    assert llm.stats().experts.pool_slots_total == 3 and llm.engine.config.expert_pool_size == total // 4


@pytest.mark.parametrize("options,message", [
    ({"cpu_threads": 0}, "cpu_threads must be an integer >= 1"),
    ({"cpu_threads": "4"}, "cpu_threads must be an integer >= 1"),
    ({"cuda_graphs": "yes"}, "cuda_graphs must be true or false"),
    ({"record_routing": 5}, "record_routing must be a file path"),
    ({"routing_profile": ["a"]}, "routing_profile must be a file path"),
])
def test_new_options_are_checked(options, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model="m", **options)


def test_profile_paths_may_be_path_objects(tmp_path):
    assert EngineConfig(model="m", record_routing=tmp_path / "r.json").record_routing == str(tmp_path / "r.json")


# ---- settings that do not fit this model or device: clamped or ignored, with a note -------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_models import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("fit") / "m", "qwen3_moe")   # 3 MoE layers, context 512


@pytest.fixture
def threads():
    """Tests that load on the CPU set torch's thread count; put it back afterwards."""
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _llm(path, **options):
    from engine import LLM
    return LLM(str(path), device="cpu", **options)


def test_context_above_the_models_limit_is_clamped_with_a_note(tiny, threads):
    llm = _llm(tiny, max_model_len=100_000)
    assert llm.engine.loaded.max_model_len == 512 and llm.engine.config.max_model_len == 512
    assert llm.engine.model_info.notes == (
        "context length 100000 is above this model's limit of 512 tokens (max_position_embeddings in its "
        "config.json); using 512",)
    assert _llm(tiny, max_model_len=128).engine.model_info.notes == ()


def test_prefetch_depth_past_the_layers_is_clamped_at_load_and_live(tiny, threads):
    llm = _llm(tiny, expert_pool_size="50%", prefetch_depth=99)
    assert llm.engine.config.prefetch_depth == 2 and llm.engine.loaded.experts.prefetch_depth == 2
    assert llm.engine.model_info.notes == (
        "prefetch depth 99 is more than this model allows (3 MoE layers, so at most 2 ahead); using 2",)
    applied = llm.reconfigure(prefetch_depth=1)
    assert "using" not in applied["prefetch_depth"] and llm.engine.loaded.experts.prefetch_depth == 1
    applied = llm.reconfigure(prefetch_depth=7)
    assert applied["prefetch_depth"].endswith("prefetch depth 7 is more than this model allows (3 MoE layers, so at "
                                              "most 2 ahead); using 2")
    assert llm.engine.config.prefetch_depth == 2 and llm.engine.loaded.experts.prefetch_depth == 2
    from engine import SamplingParams
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].token_ids   # and it still runs


def test_a_live_pool_size_that_holds_no_expert_or_every_one_says_so(tiny, threads):
    llm = _llm(tiny, expert_pool_size="50%")
    one = llm.engine.loaded.layout.nbytes
    applied = llm.reconfigure(expert_pool_size="1K")
    assert applied["expert_pool_size"].endswith(
        f"expert pool size 1.00 KiB is less than one expert takes ({format_size(one)}); the pool holds no expert, "
        "and every expert a token uses is read from host memory")
    assert "less than one expert" not in llm.reconfigure(expert_pool_size=2 * one)["expert_pool_size"]
    applied = llm.reconfigure(expert_pool_size="1T")
    assert "expert pool size 1.00 TiB is more than every expert takes" in applied["expert_pool_size"]
    assert "expert pool size" not in llm.reconfigure(expert_pool_size="50%")["expert_pool_size"]


def test_gpu_only_settings_on_the_cpu_are_noted_and_ignored(tiny, threads):
    llm = _llm(tiny, gpu_memory_budget="4G", cuda_graphs=True)
    assert llm.engine.model_info.notes == (
        "a GPU memory budget (4.00 GiB) means nothing on the CPU, which has no GPU memory to budget; ignored",
        "CUDA graphs need a CUDA GPU and mean nothing on the CPU; ignored")
    assert llm.engine.config.gpu_memory_budget is None and llm.engine.config.cuda_graphs is False
    plain = _llm(tiny)
    assert plain.engine.model_info.notes == () and plain.engine.config.cuda_graphs is False


def test_pool_settings_with_every_expert_resident_are_noted(tiny, threads):
    notes = _llm(tiny, expert_policy="lru", prefetch_depth=1).engine.model_info.notes
    assert len(notes) == 1 and notes[0].startswith("prefetch depth 1, expert policy lru: every expert is resident")
    assert "--expert-pool-size" in notes[0]


# ---- CPU threads by model size ---------------------------------------------------------------------
MiB = 1 << 20


@pytest.mark.parametrize("active,cores,expected", [
    (5 * MiB, 16, 1),          # the demo model: threading costs more than it gains
    (5 * MiB, 1, 1),
    (200 * MiB, 16, 3),
    (64 * MiB, 16, 1),
    (128 * MiB, 16, 2),
    (8 << 30, 16, 15),         # a big model: every core but one
    (8 << 30, 2, 1),
    (8 << 30, 1, 1),
])
def test_cpu_threads_grow_with_the_bytes_a_token_reads(active, cores, expected):
    from engine.cpu_threads import choose_cpu_threads
    assert choose_cpu_threads(active, cores) == expected


@pytest.mark.parametrize("env,expected", [
    ({"OMP_NUM_THREADS": "3"}, 3), ({"OMP_NUM_THREADS": "4,2"}, 4), ({"OMP_NUM_THREADS": " 2 "}, 2),
    ({"OMP_NUM_THREADS": "0"}, None), ({"OMP_NUM_THREADS": "many"}, None), ({}, None),
])
def test_thread_count_from_the_environment(env, expected):
    from engine.cpu_threads import threads_from_env
    assert threads_from_env(env) == expected


def test_load_on_the_cpu_sets_threads_by_model_size(tiny, threads):
    import torch
    torch.set_num_threads(2)
    llm = _llm(tiny)
    assert torch.get_num_threads() == 1 == llm.engine.loaded.cpu_threads     # a tiny model: one thread


def test_threads_asked_for_are_kept_and_clamped_to_the_cores(tiny, threads):
    import torch
    from engine.cpu_threads import available_cores
    cores = available_cores()
    _llm(tiny, cpu_threads=cores)
    assert torch.get_num_threads() == cores
    llm = _llm(tiny, cpu_threads=cores + 100)
    assert torch.get_num_threads() == cores
    assert llm.engine.model_info.notes == (
        f"{cores + 100} CPU threads asked for but this process may use {cores} cores; using {cores}",)


# ---- a plan that does not fit names only fixes that work --------------------------------------------
GiB = 1 << 30


def _plan_error(advice, resident=30 * GiB, pool=None, budget=24 * GiB) -> str:
    from engine.memory import plan_memory
    with pytest.raises(ConfigError) as err:
        plan_memory(resident, 9 << 20, 6144, 96 << 10, budget, pool, experts_per_layer=128, advice=advice)
    return str(err.value)


def test_budget_at_the_cards_free_memory_is_not_advised_higher():
    from engine.memory import BudgetAdvice
    msg = _plan_error(BudgetAdvice(card_free=24 * GiB))          # the default budget: what the card has free
    assert "raise --gpu-memory-budget" not in msg
    assert msg.endswith("free memory on the GPU (other programs hold it) or use a GPU with more memory")


def test_budget_below_the_card_is_advised_up_to_what_is_free():
    from engine.memory import BudgetAdvice
    msg = _plan_error(BudgetAdvice(card_free=80 * GiB))
    assert msg.endswith("raise --gpu-memory-budget (the card has 80.00 GiB free)")
    assert _plan_error(BudgetAdvice()).endswith("; raise --gpu-memory-budget")     # planning for a card not here


def test_resident_weights_in_fp32_are_advised_bfloat16():
    from engine.memory import BudgetAdvice
    msg = _plan_error(BudgetAdvice(card_free=24 * GiB, smaller_resident="use --dtype bfloat16"))
    assert msg.endswith("; use --dtype bfloat16") and "--weight-format" not in msg   # experts are not resident


def test_pool_too_big_names_int4_only_when_the_experts_are_not_int4():
    from engine.memory import BudgetAdvice
    bf16 = _plan_error(BudgetAdvice(card_free=24 * GiB), resident=GiB, pool=40 * GiB)
    assert bf16.endswith("lower --expert-pool-size (or leave it out: the pool then takes what fits) or use "
                         "--weight-format int4")
    int4 = _plan_error(BudgetAdvice(card_free=24 * GiB, smaller_experts=""), resident=GiB, pool=40 * GiB)
    assert "int4" not in int4 and int4.endswith("lower --expert-pool-size (or leave it out: the pool then takes what fits)")


def test_options_this_load_never_reads_are_noted():
    from engine import LLMEngine
    demo = str(Path(__file__).resolve().parents[2] / "resources" / "models" / "demo")
    notes = LLMEngine(EngineConfig(model=demo, device="cpu", group_size=64)).model_info.notes
    assert "group size 64 applies to int4 experts only; these experts are fp32, so it is ignored" in notes
    notes = LLMEngine(EngineConfig(model=demo, device="cpu", group_size=64, weight_format="int4")).model_info.notes
    assert not any("group size" in n for n in notes)


def test_a_resident_model_offloads_live_and_comes_back(tiny, threads):
    # Every expert fits: the pool knobs are live anyway. A smaller pool copies the experts into a host
    # store first; "automatic" (None) brings back every expert that fits; greedy output never changes.
    from engine import SamplingParams
    llm = _llm(tiny)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    ref = llm.generate([1, 2, 3], greedy)[0].token_ids
    avail = llm.engine.live.availability()
    assert all(avail[k] is None for k in ("expert_pool_size", "prefetch_depth", "expert_policy", "expert_reads"))
    assert llm.stats().memory.pinned_host_bytes == 0
    applied = llm.reconfigure(expert_pool_size="25%", prefetch_depth=1)
    assert "expert pool: " in applied["expert_pool_size"]
    st = llm.stats()
    assert st.experts.pool_slots_total == 6 and st.memory.pinned_host_bytes > 0          # 3 layers x 8 experts
    assert llm.generate([1, 2, 3], greedy)[0].token_ids == ref and llm.stats().experts.misses > 0
    llm.reconfigure(expert_pool_size=None)
    assert llm.engine.loaded.experts.static and llm.stats().experts.pool_slots_total == 24
    assert llm.generate([1, 2, 3], greedy)[0].token_ids == ref
