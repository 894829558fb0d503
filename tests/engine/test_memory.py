"""The GPU memory plan: what fits where, and one-line errors with the numbers when it does not."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.errors import ConfigError
from engine.memory import plan_memory

GiB, MiB = 1 << 30, 1 << 20
EXPERT = 9 * MiB                      # one bf16 Qwen3-30B-A3B expert
KEYS = 48 * 128                       # routed experts over all layers
KV_TOK = 96 * 1024                    # bytes per token of KV cache


def _plan(**kw):
    args = dict(resident_bytes=2 * GiB, expert_bytes=EXPERT, num_experts=KEYS, kv_bytes_per_token=KV_TOK,
                budget_bytes=24 * GiB, workspace_bytes=GiB, experts_per_layer=128, active_experts_per_token=48 * 8)
    args.update(kw)
    return plan_memory(**args)


def test_auto_pool_takes_what_is_left_after_the_kv_reserve() -> None:
    p = _plan()
    room = 24 * GiB - 3 * GiB - 4096 * KV_TOK - 128 * EXPERT
    assert p.pool_slots == room // EXPERT and p.staging_slots == 128
    assert p.total_bytes <= 24 * GiB
    assert p.kv_tokens >= 4096
    assert p.kv_bytes == 24 * GiB - 3 * GiB - (p.pool_slots + 128) * EXPERT


def test_requested_pool_and_bus_bytes() -> None:
    p = _plan(requested_pool=10 * GiB)
    assert p.pool_slots == 10 * GiB // EXPERT == 1137
    # near-uniform routing: the hit rate is the pool fraction
    assert p.bus_bytes_per_token() == pytest.approx((1 - 1137 / KEYS) * 384 * EXPERT)
    assert p.bus_bytes_per_token(hit_rate=0.9) == pytest.approx(0.1 * 384 * EXPERT)
    text = "\n".join(p.format(bus_gb_s=55))
    assert "1137/6144 experts" in text and "tok/s at 55 GB/s" in text


def test_everything_fits_needs_no_staging() -> None:
    p = _plan(budget_bytes=80 * GiB)
    assert p.pool_slots == KEYS and p.staging_slots == 0 and p.bus_bytes_per_token() == 0


def test_resident_part_too_big_names_numbers_and_fix() -> None:
    with pytest.raises(ConfigError) as err:
        _plan(resident_bytes=30 * GiB)
    msg = str(err.value)
    assert "30.00 GiB" in msg and "24.00 GiB" in msg and "--gpu-memory-budget" in msg and "\n" not in msg


def test_requested_pool_too_big() -> None:
    with pytest.raises(ConfigError, match="--expert-pool-size"):
        _plan(requested_pool=30 * GiB)


def test_cpu_has_no_budget() -> None:
    p = _plan(budget_bytes=None, requested_pool=None)
    assert p.budget_bytes is None and p.pool_slots == KEYS and p.kv_bytes == 0
    assert "none (CPU)" in p.format()[0]


def test_staging_holds_what_a_decode_step_needs_at_once_and_half_a_layer_at_least() -> None:
    from engine.memory import staging_slots
    assert staging_slots(128) == 128                           # unsized: one layer's worth
    assert staging_slots(128, 2 * 1 * 8) == 64                 # depth 2, one sequence, top-8: half a layer,
    assert staging_slots(128, 2 * 4 * 8) == 64                 # so that a prefill layer runs in two passes
    assert staging_slots(128, 2 * 6 * 8) == 96
    assert staging_slots(128, 2 * 16 * 8) == 128               # at most one layer's worth
    p = _plan(decode_experts=16)
    q = _plan()
    assert p.staging_slots == 64 and q.staging_slots == 128
    assert p.pool_slots == q.pool_slots + 64                   # the pool gets what staging does not take


def test_staging_at_no_pool_is_one_layer_of_the_largest_direct_read_step() -> None:
    # No pool: a direct-read step fills nothing for admission and gathers one layer's distinct experts
    # at a time, so batch x top-k slots do (at least half a layer, for a prefill layer's two passes);
    # a pool that holds some experts is sized the same way (its prefetches and fill slots take what is free).
    from engine.checkpoint.spec import spec_from_config
    from engine.config import EngineConfig
    from engine.memory import step_sizing
    qwen3 = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
             "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 128,
             "num_experts_per_tok": 8, "max_position_embeddings": 256}
    spec = spec_from_config(qwen3, Path("in-memory"))
    kit = EngineConfig(model="m", max_batch=8, prefetch_depth=2)
    gpu, cpu = step_sizing(spec, kit), step_sizing(spec, kit, gpu=False)
    assert gpu["direct_experts"] == 8 * 8 and cpu["direct_experts"] is None
    assert step_sizing(spec, kit.replace(expert_reads="copy"))["direct_experts"] is None
    assert step_sizing(spec, kit.replace(max_batch=32))["direct_experts"] is None     # beyond direct reads
    sizes = {k: v for k, v in gpu.items() if k != "workspace_bytes"}
    assert _plan(requested_pool=0, **sizes).staging_slots == 64
    # pooled, and copied steps on the CPU: one layer's misses of a batch of 8 too, whatever the depth
    assert _plan(**sizes).staging_slots == 64 and _plan(requested_pool=0, **cpu).staging_slots == 64
    one = {k: v for k, v in step_sizing(spec, kit.replace(max_batch=1)).items() if k != "workspace_bytes"}
    assert _plan(requested_pool=0, **one).staging_slots == 64                      # half a layer at least
    # a budget that leaves the auto pool no slot stages as an explicit 0% does
    tight = 3 * GiB + 4096 * KV_TOK + 60 * EXPERT
    auto, none = _plan(budget_bytes=tight, **sizes), _plan(budget_bytes=tight, requested_pool=0, **sizes)
    assert auto.pool_slots == 0 and auto.staging_slots == none.staging_slots == 64

def test_the_pool_takes_staging_smaller_than_a_layer_but_not_none() -> None:
    import torch

    from engine.experts.pool import ExpertPool
    from engine.experts.store import HostExpertStore
    from kernels.expert_layout import ExpertLayout
    layout = ExpertLayout.make("bf16", 8, 4)
    store = HostExpertStore.from_rows(torch.zeros(2 * 4, layout.nbytes, dtype=torch.uint8), 4, layout, pin=False)
    assert ExpertPool(store, torch.device("cpu"), 2, staging=5).staging == 5
    assert ExpertPool(store, torch.device("cpu"), 2, staging=2).staging == 2      # a layer then runs in passes
    with pytest.raises(ValueError, match="at least one"):
        ExpertPool(store, torch.device("cpu"), 2, staging=0)


def test_the_workspace_is_what_the_largest_step_allocates() -> None:
    from engine.checkpoint.spec import spec_from_config
    from engine.config import EngineConfig
    from engine.memory import step_sizing, step_workspace_bytes
    qwen3 = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
             "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 12,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
             "num_experts_per_tok": 8, "max_position_embeddings": 4096}
    spec = spec_from_config(qwen3, Path("in-memory"))
    # a 1024-token step measured on the H200 allocated 180 MiB (benchmarks/memory_profile.py): the
    # estimate covers it with room, and grows with the token budget
    one = step_workspace_bytes(spec, 1024, 8)
    assert 180 * MiB < one < 400 * MiB
    assert step_workspace_bytes(spec, 2048, 8) > 1.8 * (one - 64 * MiB)
    sizing = step_sizing(spec, EngineConfig(model="m", max_batch=4, prefetch_depth=2))
    assert sizing["decode_experts"] == 4 * 8                # a layer's misses, not the prefetches' depth
    assert sizing["workspace_bytes"] == step_workspace_bytes(spec, 2048, 4)


def test_the_memory_profile_runs_its_scenarios(tmp_path) -> None:
    """benchmarks/memory_profile.py --smoke: the kit's two scenarios on a tiny shape on the CPU."""
    import json
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "mem.json"
    subprocess.run([sys.executable, str(root / "benchmarks" / "memory_profile.py"), "--smoke", "--gen", "4",
                    "--out", str(out)], check=True, cwd=root, capture_output=True, timeout=600)
    d = json.loads(out.read_text())
    assert [p["phase"] for p in d["phases"]] == ["load", "batch 1 after 64-token prompts",
                                                 "batch 8 after 16-token prompts"]
    assert d["memory"]["resident_bytes"] > 0 and d["memory"]["pinned_host_bytes"] > 0


def test_the_memory_gap_probe_runs_its_phases(tmp_path) -> None:
    """benchmarks/memory_gap.py --smoke: a tiny checkpoint through the kit's two scenarios on the CPU, each
    phase recorded (no card here: its figures are None, and no kernel was compiled)."""
    import json
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gap.json"
    subprocess.run([sys.executable, str(root / "benchmarks" / "memory_gap.py"), "--smoke", "--out", str(out)],
                   check=True, cwd=root, capture_output=True, timeout=600)
    d = json.loads(out.read_text())
    assert [p["phase"] for p in d["phases"]] == ["engine imported", "loaded", "1 x 64-token prompts, 8 tokens",
                                                 "8 x 16-token prompts, 8 tokens",
                                                 "closed (the engine object still held)",
                                                 "closed, dropped, collected, cache emptied"]
    assert all(p["card_mib"] is None for p in d["phases"]) and d["kernels"] == []
    assert d["held_after_close"] == []            # close() let go of every tensor the engine made
    assert d["engine_memory"]["resident_bytes"] > 0 and d["what"] and d["environment"]["commit"]


def test_the_memory_gap_probe_loads_engines_in_turn(tmp_path) -> None:
    """memory_gap.py --sequence: engines of other formats and pools loaded one after the other in one
    process (as the kit's offload rows are), each one's phases named after it."""
    import json
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gap.json"
    subprocess.run([sys.executable, str(root / "benchmarks" / "memory_gap.py"), "--smoke", "--sequence",
                    "int4:0%,int4:50%", "--out", str(out)], check=True, cwd=root, capture_output=True, timeout=600)
    d = json.loads(out.read_text())
    phases = [p["phase"] for p in d["phases"]]
    assert phases[0] == "engine imported" and len(phases) == 9
    for pool in ("0%", "50%"):
        assert [p for p in phases if p.startswith(f"int4 pool {pool}: ")] == [
            f"int4 pool {pool}: {what}" for what in ("loaded", "1 x 64-token prompts, 8 tokens",
                                                     "8 x 16-token prompts, 8 tokens",
                                                     "closed, dropped, collected, cache emptied")]
    assert d["held_after_close"] == [] and "int4:0%,int4:50%" in d["what"]


def test_a_kv_cache_size_smaller_than_the_context_shortens_it_with_a_note_or_is_refused(capsys) -> None:
    # --kv-cache-size is honoured: a context left unset shrinks to what it holds (a note), one the user
    # set or a size that holds not even one block is one line naming the size that fits; 0 is refused
    from engine import LLM
    from main import main
    demo = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
    with LLM(str(demo), device="cpu", kv_cache_size="100K") as llm:
        per_token = llm.engine.loaded._kv_bytes_per_token()
        assert llm.engine.context_tokens == 100 * 1024 // per_token // 16 * 16 < 512
        assert any("(the model allows 512)" in n and "--kv-cache-size" in n for n in llm.engine.loaded.notes)
    for argv, says in ((["--kv-cache-size", "1K"], "but --kv-cache-size gives 1.00 KiB (room for 0 tokens); raise "
                                                   "--kv-cache-size to "),
                       (["--kv-cache-size", "100K", "--max-model-len", "512"], "or lower --max-model-len to "),
                       (["--kv-cache-size", "0"], "--kv-cache-size must be more than 0; leave it out")):
        assert main(["generate", "--model", str(demo), "--device", "cpu", "--prompt", "hi", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def test_the_context_is_what_the_kv_cache_the_budget_leaves_holds() -> None:
    from engine.memory import fit_context
    per_token = 36 * 1024                                  # gpt-oss-120b: 18 full-attention layers
    # fits: unchanged, no note
    assert fit_context(8192, False, 8192 * per_token, per_token, 16, 24 * GiB) == (8192, None)
    # the model's 131072 tokens do not fit the 4200 tokens left: whole blocks of what fits, and a note saying so
    tokens, note = fit_context(131072, False, 4200 * per_token, per_token, 16, 24 * GiB)
    assert tokens == 4192 and "context length 4192 tokens (the model allows 131072)" in note
    assert "lower --expert-pool-size or raise --gpu-memory-budget" in note
    # a context the user asked for is not shortened behind their back
    with pytest.raises(ConfigError, match=r"a context of 131072 tokens needs 4.50 GiB of KV cache but the 24.00 GiB "
                                          r"GPU memory budget leaves it .*; lower --max-model-len to 4192 or lower "
                                          r"--expert-pool-size or raise --gpu-memory-budget"):
        fit_context(131072, True, 4200 * per_token, per_token, 16, 24 * GiB)
    with pytest.raises(ConfigError, match="leaves it .*; lower --expert-pool-size or raise --gpu-memory-budget$"):
        fit_context(4096, False, 10 * per_token, per_token, 16, 24 * GiB)     # not even one block


def test_a_cpu_run_fits_a_context_longer_than_its_kv_cache_to_it(tmp_path, monkeypatch) -> None:
    # a model allowing ten million positions loads on the CPU with the context its 256 MiB KV cache holds
    # (RoPE tables and cache sized to it), says how to get the whole of it, and keeps a context that was set
    import engine.models.layers as layers
    from engine import LLM, SamplingParams
    from engine.memory import CPU_KV_CAP
    from tiny_models import build_tiny_model
    src = build_tiny_model(tmp_path / "long", "qwen3_moe", max_position_embeddings=10_000_000)
    with LLM(str(src), device="cpu") as llm:
        loaded = llm.engine.loaded
        per_token = loaded._kv_bytes_per_token()
        assert loaded.max_model_len == CPU_KV_CAP // per_token // 16 * 16 < 10_000_000
        assert loaded.model.rope.cos.shape[0] == loaded.max_model_len
        note = next(n for n in loaded.notes if n.startswith("context length"))
        assert "(the model allows 10000000)" in note and "pass --max-model-len 10000000 or --kv-cache-size" in note
        assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))[0].token_ids) == 4
        held = loaded.max_model_len
    from main import main
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["info", "--model", str(src), "--device", "cpu"]) == 0          # info plans the same context
    assert f"context           : {held} tokens (what the 256.00 MiB KV cache of a CPU run holds" in out.getvalue()
    monkeypatch.setattr(layers, "ROPE_CHUNK", 1000)       # tables built a chunk at a time are the same tables
    with LLM(str(src), device="cpu", max_model_len=4100) as llm:
        rope = llm.engine.loaded.model.rope
        assert llm.engine.loaded.max_model_len == 4100 and not any("context length" in n for n in llm.engine.loaded.notes)
        chunked = layers.Rope(rope.cos.shape[1], 1e6, 4100, torch.device("cpu"), rope.cos.dtype)
    monkeypatch.setattr(layers, "ROPE_CHUNK", 1 << 20)
    whole = layers.Rope(rope.cos.shape[1], 1e6, 4100, torch.device("cpu"), rope.cos.dtype)
    assert torch.equal(chunked.cos, whole.cos) and torch.equal(chunked.sin, whole.sin)


def test_a_plan_short_of_budget_names_only_the_fixes_that_can_close_the_gap():
    from engine.memory import BudgetAdvice
    MiB = 1 << 20
    advice = BudgetAdvice(smaller_resident="use --resident-weights int8")
    # 36 MiB short with 2 MiB of resident weights and 85 MiB of workspace: neither 8-bit weights (1 MiB
    # at most) nor a shorter chunk (21 MiB at most) closes it; only a bigger budget does
    assert advice.resident_fix(50 * MiB, 36 * MiB, 2 * MiB, 85 * MiB) == "raise --gpu-memory-budget"
    # 6 MiB short: the chunk can give it, the weights cannot
    assert advice.resident_fix(80 * MiB, 6 * MiB, 2 * MiB, 85 * MiB) == \
        "raise --gpu-memory-budget or lower --prefill-chunk (the step workspace takes 85.00 MiB)"
    # the resident weights dominate: 8-bit matrices save up to half of them
    assert advice.resident_fix(1 << 30, 300 * MiB, 2000 * MiB, 70 * MiB) == \
        "raise --gpu-memory-budget or use --resident-weights int8"


def test_the_kv_size_a_note_asks_for_is_the_size_that_fits() -> None:
    # 512 tokens of 3 KiB need 1.50 MiB: the note names 1.50 MiB (not the next whole MiB), and a need
    # just above it names the next hundredth, which still fits when given back.
    from engine.memory import fit_context_to_kv_size
    tokens, note = fit_context_to_kv_size(512, False, int(1.4 * 2**20), 0, 3 << 10, 16)
    assert tokens < 512 and note.endswith("raise it to 1.50 MiB for the whole context")
    tokens, note = fit_context_to_kv_size(512, False, 2**20, 0, (3 << 10) + 1, 16)
    assert note.endswith("raise it to 1.51 MiB for the whole context") and 1.51 * 2**20 >= 512 * ((3 << 10) + 1)


def test_a_cpu_runs_advice_for_the_whole_context_stays_within_the_hosts_memory(monkeypatch) -> None:
    # A model that allows 40M tokens: the default CPU cache holds fewer, and the note names the flags for the
    # whole context only where this machine could hold it; else the longest context it could (KV + RoPE)
    import engine.memory as memory
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 64 << 30)
    tokens, note = memory.fit_context_on_host(4096, False, 1 << 20, 0, 1024, 16, table_bytes_per_token=256)
    assert tokens == 1024 and note.endswith("pass --max-model-len 4096 or --kv-cache-size 4.00 MiB for the whole "
                                            "context")
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 1 << 30)
    tokens, note = memory.fit_context_on_host(40_000_000, False, 1 << 20, 0, 1024, 16, table_bytes_per_token=256)
    most = int((1 << 30) * memory.HOST_ROOM_SHARE) // (1024 + 256) // 16 * 16
    assert tokens == 1024 and note.endswith(f"the whole context needs 38.15 GiB, more than this machine's 1.00 GiB of "
                                            f"free memory; --max-model-len {most} is about the most it holds")


def test_the_kv_size_the_host_check_advises_passes_the_same_check(monkeypatch) -> None:
    # the size named is printed with two decimals of its unit: rounded down to what is printed, so that
    # giving it back always fits (rounded to the nearest, about half of them did not)
    from engine.config import format_size
    from engine.errors import ConfigError
    from engine.memory import check_host_room
    from engine.options import parse_size
    for free in range(18 << 30, 19 << 30, (1 << 30) // 97):
        try:
            check_host_room(4096, 40 << 30, 0, 1 << 10, 256, 16, 40 << 30, free)
        except ConfigError as e:
            size = str(e).split("give --kv-cache-size ")[1].split(" or less")[0]
        asked = parse_size(size.replace(" ", "").replace("iB", ""))
        assert format_size(asked) == size
        check_host_room(4096, asked, 0, 1 << 10, 256, 16, asked, free)        # fits: no error


def test_a_kv_size_whose_context_does_not_fit_is_answered_with_a_kv_size(monkeypatch) -> None:
    # a model whose own limit is 2**31 - 1 positions: its context is what --kv-cache-size holds, so the
    # fix names a smaller cache, never --max-model-len (which the user did not give); the size named fits
    from engine.errors import ConfigError
    from engine.memory import check_host_room
    from engine.options import parse_size
    bpt, table, free = 1 << 10, 256, 16 << 30
    asked = 500 << 30
    context = asked // bpt
    with pytest.raises(ConfigError) as e:
        check_host_room(context, asked, 0, bpt, table, 16, asked, free)
    assert "--max-model-len" not in str(e.value) and "give --kv-cache-size " in str(e.value)
    assert "more than the 14.40 GiB they may take (90% of the 16.00 GiB of memory this machine has free)" in str(e.value)
    size = str(e.value).split("give --kv-cache-size ")[1].split(" or less")[0]
    given = parse_size(size.replace(" ", "").replace("iB", ""))
    check_host_room(given // bpt, given, 0, bpt, table, 16, given, free)        # fits: no error


def test_a_kv_cache_size_asked_for_comes_out_of_the_pools_room_and_one_too_big_says_what_fits() -> None:
    kv = 4 * GiB
    p = _plan(kv_asked_bytes=kv)
    assert p.pool_slots == (24 * GiB - 3 * GiB - kv - 128 * EXPERT) // EXPERT       # not the 4096-token reserve
    assert p.kv_bytes >= kv and p.total_bytes <= 24 * GiB
    with pytest.raises(ConfigError) as err:            # beside a pool asked for, 4 GiB no longer fits
        _plan(kv_asked_bytes=kv, requested_pool=18 * GiB)
    msg = str(err.value)
    assert msg.startswith("the 4.00 GiB KV cache --kv-cache-size allocates (at most what a full batch fills) does "
                          "not fit the 24.00 GiB GPU memory budget")
    assert "lower --kv-cache-size to" in msg and "lower --expert-pool-size" in msg and "\n" not in msg
    fits = float(msg.split("lower --kv-cache-size to ")[1].split(" GiB")[0])
    assert _plan(kv_asked_bytes=int(fits * GiB), requested_pool=18 * GiB).kv_bytes >= int(fits * GiB)
    with pytest.raises(ConfigError, match="lower --kv-cache-size to"):               # more than all the budget
        _plan(kv_asked_bytes=100 * GiB)


def test_a_budget_with_room_for_fewer_experts_than_staging_says_why_the_pool_is_empty() -> None:
    fixed = 3 * GiB + 4096 * KV_TOK
    p = _plan(budget_bytes=fixed + 100 * EXPERT, direct_experts=8)       # room for 100, 128 staging slots
    assert p.pool_slots == 0 and p.note.startswith("no expert is pooled: the room the budget leaves holds 100 experts, no")
    short = float(p.note.split("raise --gpu-memory-budget by ")[1].split(" MiB")[0])
    grown = _plan(budget_bytes=fixed + 100 * EXPERT + int(short * MiB) + 1, direct_experts=8)
    assert grown.pool_slots >= 1 and not grown.note
    assert not _plan().note


def test_the_room_a_live_pool_may_grow_to_leaves_every_other_byte_of_the_budget() -> None:
    # a model with sliding-window layers: their KV pool is on the card too, and a pool grown live must not
    # take it (the room is what the budget leaves once the KV cache as allocated and the rest are paid)
    window = 300 * MiB
    p = _plan(window_kv_bytes=window, requested_pool=8 * GiB)
    kv = 4096 * KV_TOK
    room = p.pool_room(kv)
    assert room == 24 * GiB - p.resident_bytes - p.workspace_bytes - kv - window
    assert room + p.resident_bytes + p.workspace_bytes + kv + window == p.budget_bytes
    assert _plan(budget_bytes=None).pool_room(kv) is None
