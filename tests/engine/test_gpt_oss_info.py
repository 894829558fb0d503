"""``main.py info`` on a gpt-oss-120b config alone (no weights): the plan for a 24 GB card.

The config is the real model's numbers: 36 layers alternating sliding (window 128) and full attention,
128 experts of top-4, hidden and expert FFN 2880, 64 query / 8 KV heads of 64, vocab 201088, MXFP4 experts.
"""
from __future__ import annotations

import argparse
import json
import re

import pytest

from engine.checkpoint.spec import read_spec
from engine.cli.info import add_info_parser, plan_lines
from engine.cli.options import add_engine_flags, add_model_flag
from engine.config import format_size
from engine.errors import ConfigError
from kernels.expert_layout import ExpertLayout
from main import main

V, D, L, E, K, H, HKV, HD = 201088, 2880, 36, 128, 4, 64, 8, 64
GIB = 1 << 30
# one MXFP4 expert by hand: w13 u8 [2F, D/2], w13_scale u8 [2F, D/32], w2 u8 [D, F/2], w2_scale u8 [D, F/32],
# w13_bias f32 [2F], w2_bias f32 [D]; each starts on a 256-byte boundary
EXPERT = sum(-(-n // 256) * 256 for n in (5760 * 1440, 5760 * 90, 2880 * 1440, 2880 * 90, 5760 * 4, 2880 * 4))


@pytest.fixture(scope="module")
def gpt_oss_120b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("info") / "gpt-oss-120b"
    folder.mkdir()
    config = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": L,
        "num_local_experts": E, "num_experts_per_tok": K, "hidden_size": D, "intermediate_size": D,
        "num_attention_heads": H, "num_key_value_heads": HKV, "head_dim": HD, "vocab_size": V,
        "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * (L // 2),
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        "rope_theta": 150000, "max_position_embeddings": 131072, "attention_bias": True, "swiglu_limit": 7.0,
        "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _resident_bytes() -> int:
    """bf16 bytes of everything but the routed experts, counted from the architecture."""
    q, kv = H * HD, HKV * HD
    attention = (q + 2 * kv) * D + (q + 2 * kv) + D * q + D + H      # q/k/v/o weights and biases, sinks
    per_layer = attention + 2 * D + E * D + E                        # two norms, router weight and bias
    return 2 * (2 * V * D + L * per_layer + D)


def _line(out: str, head: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(head))


def test_the_120b_plan_for_a_24g_card(gpt_oss_120b, capsys):
    assert ExpertLayout.make("mxfp4", D, D, bias=True).nbytes == EXPERT
    assert main(["info", "--model", str(gpt_oss_120b), "--gpu-memory-budget", "24G"]) == 0
    out = capsys.readouterr().out
    assert f"routed experts {format_size(L * K * EXPERT)} in mxfp4, {format_size(EXPERT)} each" in out
    assert re.search(rf"^routed_experts\s+[\d,]+\s+{re.escape(format_size(L * E * EXPERT))}$", out, re.M)
    # the experts are offloaded, so the embedding table (one row read per token) stays in host memory
    on_card = _resident_bytes() - 2 * V * D
    assert _line(out, "resident weights  :") == f"resident weights  : {format_size(on_card)}"
    assert _line(out, "host store").endswith(f", + the embedding table ({format_size(2 * V * D)})")
    # the pool takes what the budget leaves; everything together stays inside 24 GiB
    slots = int(re.search(r"= (\d+)/4608 experts", _line(out, "expert pool")).group(1))
    assert 1400 < slots < 1600 and slots * EXPERT < 24 * GIB - on_card       # 128 staging slots beside it
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0
    # one sequence of the model's 131072 tokens would not fit the KV cache the budget leaves: the engine's context
    kv_tokens = int(re.search(r"= (\d+) tokens", _line(out, "KV cache")).group(1))
    context = int(re.search(r"^context\s+: (\d+) tokens \(that is what the KV cache", _line(out, "context  "))
                  .group(1))
    assert context == kv_tokens // 16 * 16 and context < 131072
    # KV: 18 full layers of 2 x 8 x 64 bf16 per token; the 18 window layers at most 128 tokens each
    assert _line(out, "KV per token") == "KV per token      : 36.00 KiB in 18 full-attention layers (2.00 KiB per layer)"
    assert "18 layers of a 128-token window hold at most 128 tokens of a sequence each, however long its context" in out
    # bus bytes per token: the misses of 36 layers x top-4 experts
    bus = format_size(int(0.2 * L * K * EXPERT))
    assert f"at 80.0% hit rate: {bus} per token over the bus; bus-bound at " in out
    assert f"{55e9 / (0.2 * L * K * EXPERT):.1f} tok/s on PCIe 5 (55 GB/s)" in out


def _info(folder, *flags: str) -> list[str]:
    parser = argparse.ArgumentParser()
    add_info_parser(parser.add_subparsers(dest="command"), add_model_flag, add_engine_flags)
    return plan_lines(read_spec(folder), parser.parse_args(["info", "--model", str(folder), *flags]))


def test_bus_bytes_at_the_hit_rate_asked_for(gpt_oss_120b):
    lines = _info(gpt_oss_120b, "--gpu-memory-budget", "24G", "--hit-rate", "0.9")
    line = next(x for x in lines if "(--hit-rate)" in x)
    assert line.startswith(f"  at 90.0% hit rate (--hit-rate): {format_size(int(0.1 * L * K * EXPERT))} per token")
    with pytest.raises(ConfigError, match=r"^--hit-rate 1.5 is not a hit rate; give a share from 0 to 1 or a "
                                          r"percentage, e.g. 0.8 or 80%$"):
        _info(gpt_oss_120b, "--gpu-memory-budget", "24G", "--hit-rate", "1.5")


def test_int4_experts_need_a_group_that_divides_2880(gpt_oss_120b):
    lines = _info(gpt_oss_120b, "--gpu-memory-budget", "24G", "--weight-format", "int4", "--group-size", "64")
    # int4 groups of 64: 4 bits + an fp16 scale and a uint8 zero per 64 values, larger than MXFP4's 4.25 bits
    int4 = ExpertLayout.make("int4", D, D, 64, bias=True).nbytes
    assert int4 > EXPERT and any(f"in int4, {format_size(int4)} each" in x for x in lines)


def test_the_120b_over_two_24g_cards(gpt_oss_120b, capsys):
    """--pipeline-parallel 2: the first card, with the embedding and LM head, takes fewer layers; both
    keep about the same share of their experts; the cards' KV room is less than one sequence at the
    full context, so the context is what the card with the least room holds, as the engine's stages
    agree it (engine.parallel.stages.agree_kv), and a context set longer is refused, naming that card."""
    args = ["info", "--model", str(gpt_oss_120b), "--pipeline-parallel", "2", "--gpu-memory-budget", "24G,24G"]
    assert main(args) == 0
    out = capsys.readouterr().out
    first = re.search(r"stage 0 \(GPU 0\): layers 0-(\d+) \((\d+) layers", out)
    assert first and int(first.group(2)) < L // 2
    shares = [int(s) for s in re.findall(r"expert pool       : [\d.]+ GiB = \d+/\d+ experts \((\d+)%\)", out)]
    assert len(shares) == 2 and abs(shares[0] - shares[1]) <= 3
    tokens = [int(t) for t in re.findall(r"KV cache          : [\d.]+ MiB = (\d+) tokens", out)]
    room, card = min((t // 16, r) for r, t in enumerate(tokens))      # whole blocks of 16 tokens
    assert room * 16 < 131072
    assert (f"every card keeps the same {room:,} blocks of 16, so the pipeline holds {room * 16:,} tokens of "
            "context") in out
    assert _line(out, "context  ") == (f"context           : {room * 16} tokens (that is what the KV cache the 24.00 "
                                       f"GiB budget of GPU {card} leaves holds; lower --expert-pool-size or raise "
                                       "--gpu-memory-budget for a longer one)")
    assert main(args + ["--max-model-len", "131072"]) == 2
    assert re.fullmatch(rf"error: a context of 131072 tokens needs .* of KV cache but the 24.00 GiB GPU memory budget "
                        rf"of GPU {card} leaves it .*; lower --max-model-len to {room * 16} or lower "
                        rf"--expert-pool-size or raise --gpu-memory-budget\n", capsys.readouterr().err)


def test_the_120b_over_two_24g_cards_with_expert_parallel(gpt_oss_120b, capsys):
    """--expert-parallel 2: the KV cache is GPU 0's alone; the context is what it holds there for one
    sequence (the rule of one card), and a context set longer is refused, naming GPU 0."""
    args = ["info", "--model", str(gpt_oss_120b), "--expert-parallel", "2", "--gpu-memory-budget", "24G,24G"]
    assert main(args) == 0
    found = re.fullmatch(r"context           : (\d+) tokens \(that is what the KV cache the 24.00 GiB budget of GPU 0 "
                         r"leaves holds; lower --expert-pool-size or raise --gpu-memory-budget for a longer one\)",
                         _line(capsys.readouterr().out, "context  "))
    assert found and 0 < int(found.group(1)) < 131072 and int(found.group(1)) % 16 == 0
    assert main(args + ["--max-model-len", "131072"]) == 2
    assert re.fullmatch(r"error: a context of 131072 tokens needs .* budget of GPU 0 leaves it .*; lower --max-model-len "
                        rf"to {found.group(1)} or lower --expert-pool-size or raise --gpu-memory-budget\n",
                        capsys.readouterr().err)


def test_a_kv_cache_size_on_a_24g_card_is_counted_in_its_budget(gpt_oss_120b, capsys):
    args = ["info", "--model", str(gpt_oss_120b), "--gpu-memory-budget", "24G"]
    assert main(args + ["--kv-cache-size", "10G"]) == 0
    out = capsys.readouterr().out
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0      # the pool gave the KV its room
    full, window = re.search(r": ([\d.]+) GiB = .*\+ ([\d.]+) MiB for the sliding", _line(out, "KV cache")).groups()
    assert abs(float(full) * 1024 + float(window) - 10 * 1024) < 8          # the 10 GiB asked for, both pools
    assert main(args + ["--kv-cache-size", "100G"]) == 2
    err = capsys.readouterr().err
    assert "KV cache --kv-cache-size allocates (at most what a full batch fills) does not fit the 24.00 GiB" in err
    fits = re.search(r"lower --kv-cache-size to ([\d.]+ GiB)", err).group(1)
    assert main(args + ["--kv-cache-size", fits.replace(" ", "").replace("iB", "")]) == 0
    out = capsys.readouterr().out
    assert float(_line(out, "device total").split(":")[1].split()[0]) <= 24.0


def test_a_budget_too_small_for_mxfp4_experts_does_not_advise_int4(gpt_oss_120b, capsys):
    # int4 experts (4.5 bits a weight with their scales) are larger than mxfp4's 4.25: no way out there
    assert main(["info", "--model", str(gpt_oss_120b), "--gpu-memory-budget", "4G"]) == 2
    err = capsys.readouterr().err
    assert "raise --gpu-memory-budget" in err and "int4" not in err


def test_int4_at_the_default_group_says_the_group_a_load_takes(gpt_oss_120b, capsys):
    assert main(["info", "--model", str(gpt_oss_120b), "--weight-format", "int4"]) == 0
    assert "note: int4 groups of 64: 128 does not divide this model's expert widths" in capsys.readouterr().err


def test_a_kv_cache_size_over_a_pipeline_comes_out_of_each_cards_pool(gpt_oss_120b, capsys):
    """Each stage allocates its layers' share of --kv-cache-size, so each card's plan keeps that share
    out of its pool; a size that does not fit names the whole size that does, which then fits."""
    args = ["info", "--model", str(gpt_oss_120b), "--pipeline-parallel", "2", "--gpu-memory-budget", "24G,24G"]
    pools = re.compile(r"expert pool       : [\d.]+ GiB = (\d+)/\d+ experts")
    assert main(args) == 0
    plain = [int(s) for s in pools.findall(capsys.readouterr().out)]
    assert main(args + ["--kv-cache-size", "6G"]) == 0
    out = capsys.readouterr().out
    asked = [int(s) for s in pools.findall(out)]
    assert len(asked) == 2 and all(a < p for a, p in zip(asked, plain))
    kv = [float(x) for x in re.findall(r"KV cache          : ([\d.]+) GiB", out)]
    assert len(kv) == 2 and 5.5 < sum(kv) <= 6.0        # less the sliding-window layers' pools
    assert main(args + ["--kv-cache-size", "100G"]) == 2
    err = capsys.readouterr().err
    assert re.match(r"error: the [\d.]+ GiB KV cache this card's \d+% share of --kv-cache-size allocates", err)
    # each card names the size its own room holds: following the advice fits within one step per card
    sizes, rc = [100.0], 2
    while rc:
        assert rc == 2 and err.startswith("error: ") and len(sizes) <= 2
        sizes.append(float(err.split("lower --kv-cache-size to ")[1].split(" GiB")[0]))
        assert 1 < sizes[-1] < sizes[-2]
        rc = main(args + ["--kv-cache-size", f"{sizes[-1]}G"])
        err = capsys.readouterr().err
