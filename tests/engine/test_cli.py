"""The command line as a user runs it: generate --json, info with a GPU budget."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from main import main
from tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("cli") / "m", "qwen2_moe")


def test_generate_json_reports_text_tokens_and_reason(model, capsys):
    assert main(["generate", "--model", str(model), "--prompt", "Hello world", "--max-tokens", "7",
                 "--temperature", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finish_reason"] in ("length", "stop") and 0 < out["completion_tokens"] <= 7
    assert len(out["token_ids"]) == out["completion_tokens"] and isinstance(out["text"], str)


def test_info_counts_bytes_by_category_and_plans_a_budget(model, capsys):
    assert main(["info", "--model", str(model), "--gpu-memory-budget", "4G"]) == 0
    out = capsys.readouterr().out
    for category in ("embeddings", "attention", "router", "dense_mlp", "shared_experts", "routed_experts"):
        assert category in out
    assert "active per token" in out and "GPU memory budget : 4.00 GiB" in out
    assert "expert pool       :" in out and "per token over the bus" in out


def test_info_counts_what_the_engine_holds(model, capsys, monkeypatch):
    # on the CPU the engine computes in float32, so the sizes info prints are float32's; with a GPU
    # budget they are bfloat16's, and the KV cache is what a full batch fills, as the engine allocates
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["info", "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "resident matrices in float32" in out
    assert "sizes in float32  : what a CPU run computes in (no CUDA GPU here); pass --gpu-memory-budget 24G" in out
    # K and V of 3 layers x 2 KV heads x 16 dims in 4 bytes, 512 tokens
    assert "KV of one sequence: 384.00 KiB at 512 tokens" in out
    assert main(["info", "--model", str(model), "--gpu-memory-budget", "24G"]) == 0
    out = capsys.readouterr().out
    assert "resident matrices in bfloat16" in out and "sizes in float32" not in out
    kv = next(line for line in out.splitlines() if line.startswith("KV cache"))
    assert "(what a full batch fills, 16 sequences of" in out and "GiB" not in kv


def test_a_kv_cache_size_past_a_full_batch_is_capped_with_a_note(model, capsys):
    assert main(["generate", "--model", str(model), "--prompt", "Hi", "--max-tokens", "2", "--kv-cache-size", "50G"]) == 0
    err = capsys.readouterr().err
    assert "note: --kv-cache-size 50.00 GiB is more than 16 sequences of" in err and "is allocated" in err


def test_info_says_when_the_resident_part_does_not_fit(model, capsys):
    assert main(["info", "--model", str(model), "--gpu-memory-budget", "1M"]) == 2
    err = capsys.readouterr().err
    assert "the GPU memory budget is 1.00 MiB" in err and "raise --gpu-memory-budget" in err


def test_chat_streams_replies_resets_and_exits(model, capsys, monkeypatch):
    lines = iter(["Hello there", "/reset", "More", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["chat", "--model", str(model), "--max-tokens", "5", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Strata chat — m, chat.")          # the tiny model has a chat template
    assert "(conversation cleared)" in out


def test_chat_on_a_base_model_continues_text(model, capsys, monkeypatch, tmp_path):
    import json
    import shutil
    base = tmp_path / "base"
    shutil.copytree(model, base)
    (base / "STRATA_DEMO.json").write_text(json.dumps({"demo": True, "completion_only": True}))
    monkeypatch.setattr("builtins.input", lambda prompt="": (_ for _ in ()).throw(EOFError))
    assert main(["chat", "--model", str(base)]) == 0
    assert "completion (a base model" in capsys.readouterr().out


# ---- notes, flags whose advice must work, the thread count the user set ------------------------------
def test_info_prints_what_a_load_would_clamp(model, capsys):
    assert main(["info", "--model", str(model), "--max-model-len", "99999", "--prefetch-depth", "9",
                 "--gpu-memory-budget", "4G"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: context length 99999 is above this model's limit of 512 tokens (max_position_embeddings "
                   "in its config.json); using 512",
                   "note: prefetch depth 9 is more than this model allows (2 MoE layers, so at most 1 ahead); using 1"]


def test_a_pool_larger_than_every_expert_is_noted_by_info_and_by_a_load(model, capsys):
    assert main(["info", "--model", str(model), "--expert-pool-size", "30G", "--gpu-memory-budget", "4G"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"note: --expert-pool-size 30.00 GiB is more than every expert takes \([0-9.]+ [KM]iB\); the "
                     r"pool holds every expert and the rest is left free", err)
    from engine.loading import load_model
    from engine.config import EngineConfig
    loaded = load_model(EngineConfig(model=str(model), device="cpu", expert_pool_size=30 << 30))
    assert any(n.startswith("--expert-pool-size 30.00 GiB is more than every expert takes") for n in loaded.notes)


def test_a_pool_smaller_than_one_expert_is_noted_by_info_and_by_a_load(model, capsys):
    assert main(["info", "--model", str(model), "--expert-pool-size", "1K", "--gpu-memory-budget", "4G"]) == 0
    assert re.search(r"note: --expert-pool-size 1.00 KiB is less than one expert takes \([0-9.]+ [KM]iB\); the pool "
                     r"holds no expert", capsys.readouterr().err)
    from engine.config import EngineConfig
    from engine.loading import load_model
    loaded = load_model(EngineConfig(model=str(model), device="cpu", expert_pool_size=1 << 10))
    assert any(n.startswith("--expert-pool-size 1.00 KiB is less than one expert takes") for n in loaded.notes)


def test_a_chat_template_that_does_not_parse_leaves_plain_prompts_working(model, tmp_path, capsys, monkeypatch):
    import shutil
    copy = tmp_path / "tpl"
    shutil.copytree(model, copy)
    cfg = json.loads((copy / "tokenizer_config.json").read_text()) if (copy / "tokenizer_config.json").exists() else {}
    cfg["chat_template"] = "{{ messages | nosuchfilter }}"
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    assert main(["generate", "--model", str(copy), "--prompt", "hi", "--max-tokens", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["token_ids"]
    assert (f"note: the model folder's chat template does not parse at line 1 of chat_template in "
            f"{copy / 'tokenizer_config.json'} (No filter named 'nosuchfilter'.); fix the template there") in err
    assert "until then chat is refused and plain prompts work" in err
    # chat runs in completion mode and says why: not "a base model"
    monkeypatch.setattr("builtins.input", lambda prompt="": (_ for _ in ()).throw(EOFError))
    assert main(["chat", "--model", str(copy), "--system", "be brief"]) == 0
    out, err = capsys.readouterr()
    assert "completion (its chat template cannot be used, see the note" in out and "base model" not in out
    assert "--system is not used: in completion mode" in err


def test_the_default_prefetch_depth_is_fitted_to_a_small_model_without_a_note(model, capsys):
    # The model has 2 MoE layers, so the default depth 2 becomes 1: the user asked for nothing, so
    # nothing is said about it (an explicit --prefetch-depth 9 is noted, above).
    assert main(["info", "--model", str(model)]) == 0
    assert "prefetch depth" not in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, says", [
    ("--gpu-memory-budget", "-3G", "--gpu-memory-budget -3G is not a size"),
    ("--expert-pool-size", "-1G", "--expert-pool-size -1G is not a size"),
])
def test_a_negative_size_after_its_flag_gets_the_sizes_own_message(model, capsys, flag, value, says):
    # argparse alone would read "-3G" as a flag and say "expected one argument"
    assert main(["info", "--model", str(model), flag, value]) == 2
    assert says in capsys.readouterr().err


def test_info_checks_the_engine_options(model, capsys):
    assert main(["info", "--model", str(model), "--max-batch", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-batch must be an integer >= 1 (got 0)"


@pytest.mark.parametrize("argv,line", [
    (["--max-tokens", "-5"], "error: --max-tokens must be a whole number >= 1 (got -5); a reply needs at least 1 token"),
    (["--top-p", "7"], "error: --top-p must be a number in (0, 1] (got 7.0); 1 turns it off"),
    (["--temperature", "-1"], "error: --temperature must be a number >= 0 (got -1.0); 0 is greedy"),
])
def test_a_refused_value_is_named_by_its_flag(model, capsys, argv, line):
    assert main(["generate", "--model", str(model), "--prompt", "Hi", *argv]) == 2
    assert capsys.readouterr().err.strip() == line


@pytest.mark.parametrize("argv,line", [
    (["--gpu-memory-budget", "12X"], "error: --gpu-memory-budget 12X is not a size; write bytes or a number with K, M, "
                                     "G or T, e.g. 10G"),
    (["--max-batch-tokens", "1"], "error: --max-batch-tokens 1 is below --max-batch 16; raise --max-batch-tokens or "
                                  "lower --max-batch"),
    (["--expert-policy", "static"], "error: --expert-policy static needs --routing-profile FILE (record one with "
                                    "--record-routing)"),
])
def test_a_setting_a_message_names_by_its_python_name_reads_as_its_flag(model, capsys, argv, line):
    assert main(["generate", "--model", str(model), "--prompt", "Hi", *argv]) == 2
    assert capsys.readouterr().err.strip() == line


def test_kv_cache_size_named_by_a_message_is_a_flag(model, capsys):
    """The scoring error says "raise --kv-cache-size": the flag exists and sizes the cache."""
    from engine.cli.main import build_parser
    from engine.cli.options import engine_options
    parser, _ = build_parser()
    args = parser.parse_args(["eval", "--text", "t.txt", "--kv-cache-size", "3M"])
    assert engine_options(args, environ={})["kv_cache_size"] == "3M"
    assert main(["generate", "--model", str(model), "--prompt", "Hi", "--max-tokens", "2", "--kv-cache-size", "1M",
                 "--temperature", "0"]) == 0


@pytest.mark.parametrize("argv,env,expected", [
    ([], {}, None),                                        # chosen by model size at load
    ([], {"OMP_NUM_THREADS": "3"}, 3),                     # the user's OpenMP setting counts
    (["--cpu-threads", "2"], {"OMP_NUM_THREADS": "3"}, 2),  # the flag wins
])
def test_cpu_threads_from_flag_or_environment(argv, env, expected):
    from engine.cli.main import build_parser
    from engine.cli.options import engine_options
    parser, _ = build_parser()
    assert engine_options(parser.parse_args(["generate", "--prompt", "x", *argv]), environ=env)["cpu_threads"] == expected


def test_gpu_only_flags_on_the_cpu_are_noted(model, capsys):
    assert main(["generate", "--model", str(model), "--prompt", "Hi", "--max-tokens", "2", "--device", "cpu",
                 "--gpu-memory-budget", "24G", "--cuda-graphs"]) == 0
    err = capsys.readouterr().err
    assert "means nothing on the CPU, which has no GPU memory to budget; ignored" in err
    assert "CUDA graphs need a CUDA GPU and mean nothing on the CPU; ignored" in err


# ---- --record-routing and --routing-profile are checked before the model loads -------------------------
@pytest.fixture
def broken_weights(model, tmp_path):
    """A copy of the model whose weights cannot load: an error about a path proves it came first."""
    import shutil
    dst = tmp_path / "broken"
    shutil.copytree(model, dst)
    shard = dst / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    return dst


def _generate(capsys, model, *flags) -> tuple[int, str]:
    code = main(["generate", "--model", str(model), "--prompt", "Hi", "--max-tokens", "3", "--temperature", "0",
                 *flags])
    return code, capsys.readouterr().err.strip()


def test_record_routing_into_a_missing_folder(broken_weights, tmp_path, capsys):
    target = tmp_path / "nope" / "r.json"
    code, err = _generate(capsys, broken_weights, "--record-routing", str(target))
    assert code == 2 and err == (f"error: --record-routing {target}: the folder {target.parent} does not exist; "
                                 "create it first or record to a file in an existing folder")


def test_record_routing_onto_a_folder(broken_weights, tmp_path, capsys):
    code, err = _generate(capsys, broken_weights, "--record-routing", str(tmp_path))
    assert code == 2 and err == (f"error: --record-routing {tmp_path} is a folder; give a file path such as "
                                 f"{tmp_path / 'routing.json'}")


def test_record_routing_under_a_regular_file(broken_weights, tmp_path, capsys):
    (tmp_path / "f.txt").write_text("mine")
    code, err = _generate(capsys, broken_weights, "--record-routing", str(tmp_path / "f.txt" / "r.json"))
    assert code == 2 and err.endswith(f"{tmp_path / 'f.txt'} is a file, not a folder; record to a file in a folder")
    assert (tmp_path / "f.txt").read_text() == "mine"


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's read-only /sys")
def test_record_routing_into_an_unwritable_place(broken_weights, capsys):
    code, err = _generate(capsys, broken_weights, "--record-routing", "/sys/kernel/routing.json")
    assert code == 2 and err.startswith("error: --record-routing /sys/kernel/routing.json: cannot write into "
                                        "/sys/kernel (")
    assert err.endswith("record to a folder you can write to") and "\n" not in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes through permissions")
def test_record_routing_into_a_read_only_folder(broken_weights, tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        code, err = _generate(capsys, broken_weights, "--record-routing", str(folder / "r.json"))
    finally:
        folder.chmod(0o700)
    assert code == 2 and "cannot write into" in err


def test_record_routing_writes_a_profile_that_reads_back(model, tmp_path, capsys):
    from engine.experts.profile import read_routing_profile
    target = _profile(tmp_path / "r.json")                                   # an earlier recording
    code, _ = _generate(capsys, model, "--record-routing", str(target), "--device", "cpu")
    assert code == 0
    counts = read_routing_profile(target, num_layers=2, num_experts=6)     # 2 MoE layers x 6 experts
    assert sum(map(sum, counts)) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]        # no probe or temporary file left


@pytest.mark.parametrize("content", ['{"architectures": ["Qwen3MoeForCausalLM"]}', "my notes", ""])
def test_record_routing_never_replaces_a_file_that_is_not_a_profile(model, tmp_path, capsys, content):
    target = tmp_path / "config.json"
    target.write_text(content)
    code, err = _generate(capsys, model, "--record-routing", str(target), "--device", "cpu")
    assert code == 2 and err == (f"error: --record-routing {target} exists and is not a routing profile, so it is "
                                 "kept; record to a new file (an earlier profile may be recorded over)")
    assert target.read_text() == content


def _profile(path, **doc):
    path.write_text(json.dumps({"format": "strata-routing-profile", "version": 1, "num_layers": 2,
                                "num_experts": 6, "counts": [[1] * 6, [2] * 6], **doc}))
    return path


@pytest.mark.parametrize("make,says", [
    (lambda p: p, "cannot read --routing-profile {p} (No such file or directory); give an existing profile file"),
    (lambda p: (p.write_text("{not json"), p)[1], "--routing-profile {p} is not valid JSON"),
    (lambda p: (p.write_text("[1, 2]"), p)[1], "--routing-profile {p} is not a Strata routing profile"),
    (lambda p: _profile(p, counts=[[1] * 6]), "--routing-profile {p} was recorded for 2 layers x 6 experts, but the "
                                              "model has 2 x 6"),
    (lambda p: _profile(p, counts=[[1] * 5, [1] * 5], num_experts=5), "was recorded for 2 layers x 5 experts"),
    (lambda p: _profile(p, counts=[[True] * 6, [1] * 6]), "holds counts that are not non-negative integers"),
    (lambda p: _profile(p, counts=[[-1] * 6, [1] * 6]), "holds counts that are not non-negative integers"),
    (lambda p: _profile(p, version=2), "has format version 2, this Strata reads version 1"),
], ids=["missing", "not-json", "a-list", "too-few-layers", "too-few-experts", "bools", "negative", "version"])
def test_routing_profile_is_checked_before_the_model_loads(broken_weights, tmp_path, capsys, make, says):
    path = make(tmp_path / "profile.json")
    code, err = _generate(capsys, broken_weights, "--routing-profile", str(path), "--expert-policy", "static")
    assert code == 2 and "\n" not in err and says.format(p=path) in err


def test_a_good_routing_profile_loads(model, tmp_path, capsys):
    path = _profile(tmp_path / "profile.json")
    code, _ = _generate(capsys, model, "--routing-profile", str(path), "--expert-policy", "static",
                        "--expert-pool-size", "50%", "--device", "cpu")
    assert code == 0


def test_output_into_a_reader_that_stops_early_ends_quietly(model):
    # `main.py info | head -1`: the pipe closes while output is still coming; no traceback, no error
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(root / "main.py"), "info", "--model", str(model)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
    proc.stdout.close()                                   # gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.parametrize("budget", [[], ["--gpu-memory-budget", "24G"]])
@pytest.mark.parametrize("typed", ["2", "150%"])
def test_info_refuses_a_hit_rate_outside_0_to_1_with_or_without_a_budget(model, capsys, budget, typed):
    assert main(["info", "--model", str(model), "--hit-rate", typed, *budget]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --hit-rate {typed} is not a hit rate; give a share from 0 to 1 "
                                               "or a percentage, e.g. 0.8 or 80%")        # as typed, not 1.5


def test_info_takes_a_hit_rate_as_a_percentage(model, capsys):
    # --expert-pool-size takes 50%; --hit-rate takes 80% as well as 0.8, and prices the bus the same
    assert main(["info", "--model", str(model), "--gpu-memory-budget", "4G", "--hit-rate", "80%"]) == 0
    percent = capsys.readouterr().out
    assert main(["info", "--model", str(model), "--gpu-memory-budget", "4G", "--hit-rate", "0.8"]) == 0
    assert capsys.readouterr().out == percent and "(--hit-rate)" in percent
    assert main(["info", "--model", str(model), "--hit-rate", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'lots' is not a hit rate" in err and "80%" in err


@pytest.mark.parametrize("flag", ["--prompt", "--stop"])
def test_text_that_is_not_utf8_is_one_line_before_anything_loads(model, capsys, flag):
    # bytes the shell passes that are not UTF-8 reach Python as lone surrogates, which no tokenizer takes
    text = {"--prompt": "ok \udcff", "--stop": "ok"}
    stop = ["--stop", "\udcff"] if flag == "--stop" else []
    assert main(["generate", "--model", str(model), "--prompt", text[flag], "--max-tokens", "2", *stop]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"argument {flag}: is not UTF-8 text" in err and "LANG=C.UTF-8" in err


def test_a_context_the_host_cannot_hold_is_one_line_naming_what_fits(model, capsys, monkeypatch):
    # On the CPU the KV cache and the RoPE tables grow with the context a user asks for; past the memory
    # the host has free, the load stops with the largest setting that fits, not a process the system kills.
    import engine.loading as loading
    from engine import LLM
    with LLM(str(model), device="cpu") as llm:          # the weights: the memory the check leaves them first
        plan = llm.engine.loaded.plan
    weights = plan.resident_bytes + plan.host_bytes
    monkeypatch.setattr(loading, "available_host_bytes", lambda: weights + (4 << 20))
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "1",
                 "--kv-cache-size", "1G"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"error: --kv-cache-size 1\.00 GiB makes a KV cache of [\d.]+ MiB, more than the 4\.00 MiB of "
                        r"memory this machine has free beside the model's weights holds; give --kv-cache-size "
                        r"[\d.]+ [KM]iB or less", err), err
    size, unit = re.search(r"give --kv-cache-size ([\d.]+) ([KM])iB", err).groups()
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "1", "--kv-cache-size",
                 size + unit]) == 0                                      # the size it names loads
    capsys.readouterr()
    monkeypatch.setattr(loading, "available_host_bytes", lambda: weights + (256 << 10))
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "1", "--max-model-len",
                 "512"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"error: a context of 512 tokens needs [\d.]+ [KM]iB of host memory for its KV cache, but this "
                        r"machine has 256\.00 KiB of memory free beside the model's weights; lower --max-model-len "
                        r"to \d+ or less", err), err
    tokens = re.search(r"lower --max-model-len to (\d+)", err).group(1)
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "1", "--max-model-len",
                 tokens]) == 0
    monkeypatch.setattr(loading, "available_host_bytes", lambda: weights // 2)
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "1"]) == 0   # no word on
    capsys.readouterr()                                  # what no context setting could change


def test_a_quoted_name_is_a_files_field_and_stays_as_written():
    import argparse

    from engine.cli.main import as_flags
    args = argparse.Namespace(group_size=128, max_batch=16)
    line = "strata.json: field 'group_size' is '128', expected a whole number; raise max_batch"
    assert as_flags(line, args) == "strata.json: field 'group_size' is '128', expected a whole number; raise --max-batch"


def test_info_for_a_cpu_run_on_a_machine_with_a_gpu_plans_the_cpu_run(model, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)       # a GPU here, but the run is on the CPU
    assert main(["info", "--model", str(model), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "GPU budget: none given and a CPU run (--device cpu)" in out and "resident matrices in float32" in out


def test_ctrl_c_during_generate_keeps_the_text_and_exits_130(model, capsys, monkeypatch):
    # Ctrl-C after the third step: the text so far stays on screen (and in --json), a note says the
    # reply is cut short, and the exit code tells a script it was interrupted
    from engine.engine import LLMEngine
    real, steps = LLMEngine.step, []

    def step(self):
        steps.append(1)
        if len(steps) == 4:
            raise KeyboardInterrupt
        return real(self)
    monkeypatch.setattr(LLMEngine, "step", step)
    assert main(["generate", "--model", str(model), "--prompt", "Hello world", "--max-tokens", "50", "--json"]) == 130
    out, err = capsys.readouterr()
    reply = json.loads(out.strip().splitlines()[-1])
    assert reply["finish_reason"] == "abort" and 0 < reply["completion_tokens"] < 50
    assert f"note: interrupted after {reply['completion_tokens']} tokens; the reply is cut short" in err


@pytest.mark.parametrize("when", ["loading", "closing"])
def test_ctrl_c_outside_the_reply_says_whether_the_text_is_whole(model, capsys, monkeypatch, when):
    # Ctrl-C while the model loads: nothing was generated; after the reply ended (the engine closing):
    # the text above is complete. Either way one note and exit 130, never a silent 130.
    from engine.engine import LLMEngine

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(LLMEngine, "__init__" if when == "loading" else "close", interrupted)
    assert main(["generate", "--model", str(model), "--prompt", "Hello world", "--max-tokens", "5",
                 "--temperature", "0"]) == 130
    out, err = capsys.readouterr()
    if when == "loading":
        assert out == "" and "note: interrupted before the reply began; nothing was generated" in err
    else:
        assert out.strip() and "note: interrupted after the reply had ended; the text above is complete" in err


START_NOTE = "note: interrupted while Strata was starting; nothing was done"
GENERATE_NOTE = "note: interrupted before the reply began; nothing was generated"


@pytest.mark.parametrize("argv, note", [(["info"], START_NOTE), (["generate", "--prompt", "hi"], GENERATE_NOTE)])
def test_ctrl_c_while_a_command_starts_exits_130_with_one_line_and_no_traceback(capsys, monkeypatch, argv, note):
    # Ctrl-C while the flags are read, from either entry point (python -m engine, main.py / strata): a
    # script reading the output learns that it ended and that nothing was done, not a silent 130
    import engine.cli.main as cli
    import strata.cli as top

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "parse", interrupted)
    monkeypatch.setattr(top, "parse", interrupted)
    for entry in (cli.main, top.main):
        assert entry(list(argv)) == 130
        out, err = capsys.readouterr()
        assert out == "" and err.strip() == note


def test_ctrl_c_while_the_model_code_loads_says_so_in_one_line(capsys, monkeypatch):
    # the commands' modules (the model code: seconds on a first run) load once the flags are read
    import builtins

    import engine.cli.main as cli
    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "engine.cli" and "run" in (args[2] if len(args) > 2 and args[2] else ()):
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert cli.main(["generate", "--prompt", "hi"]) == 130
    assert capsys.readouterr().err.strip() == GENERATE_NOTE


@pytest.mark.parametrize("argv, note", [(["main.py", "generate", "--prompt", "hi"], GENERATE_NOTE),
                                        (["main.py", "info"], START_NOTE), (["main.py"], START_NOTE)])
def test_ctrl_c_while_torch_imports_says_so_in_one_line(capsys, monkeypatch, argv, note):
    # main.py's first seconds import torch, before any command runs: its SIGINT handler says the same
    import strata.cli as top
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as ended:
        top._interrupted_while_importing(signal.SIGINT, None)
    assert ended.value.code == 130 and capsys.readouterr().err.strip() == note


def test_info_plans_from_the_config_and_notes_what_would_stop_a_load(model, tmp_path, capsys):
    import shutil
    assert main(["info", "--model", str(model)]) == 0
    assert "loading this folder would fail" not in capsys.readouterr().err        # a whole checkpoint
    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(model / "config.json", bare)
    for f in model.glob("tokenizer*.json"):
        shutil.copy(f, bare)
    assert main(["info", "--model", str(bare)]) == 0
    out, err = capsys.readouterr()
    assert "Parameters" in out or "parameters" in out                                 # the plan still prints
    assert f"loading this folder would fail: no *.safetensors weights in {bare}" in err


def test_the_installed_command_and_python_m_strata_are_main_py(tmp_path):
    # the console script, python -m strata and main.py run one program: the workbench by default, the
    # same usage lines under the name the user typed
    import subprocess
    import sys
    tomllib = pytest.importorskip("tomllib")          # Python 3.11+
    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"strata": "strata.cli:run"}
    import main as script
    from strata import cli
    assert script.main is cli.main
    run = subprocess.run([sys.executable, "-m", "strata", "gui", "--help"], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("usage: strata gui")
    run = subprocess.run([sys.executable, "-m", "engine", "info", "--help"], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("usage: strata info")


def test_an_empty_model_flag_is_refused_not_taken_for_the_demo(capsys):
    # --model "$MODEL" with MODEL unset: the demo model answering would hide the mistake
    for command in (["generate", "--prompt", "Hi"], ["info"]):
        assert main([*command, "--model", ""]) == 2
        assert capsys.readouterr().err.strip() == ("error: --model is empty; give a model folder, or leave --model out "
                                                   "for the bundled demo")


def test_a_prompt_past_the_context_names_the_flag_that_lets_generate_drop_its_start(model, capsys):
    assert main(["generate", "--model", str(model), "--prompt", "word " * 400, "--max-tokens", "2",
                 "--max-model-len", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the prompt needs ") and err.endswith(
        "shorten the prompt or pass --context-overflow drop-oldest")


def test_int4_at_load_picks_the_group_that_divides_the_widths_as_convert_does(tmp_path, capsys):
    # gpt-oss's widths (2880) are not multiples of 128: a load at int4 refused with "pass --group-size 64"
    # where convert picked 64 by itself; the load now picks it too, with the same note
    model = build_tiny_model(tmp_path / "oss", "gpt_oss")
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2",
                 "--weight-format", "int4"]) == 0
    err = capsys.readouterr().err
    assert "note: int4 groups of 32: 128 does not divide this model's expert widths" in err
    assert main(["info", "--model", str(model), "--weight-format", "int4", "--gpu-memory-budget", "1G"]) == 0
    capsys.readouterr()                                       # info plans the same load
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2", "--weight-format", "int4",
                 "--group-size", "64"]) == 2                  # a group asked for that does not fit is still refused
    assert "pass --group-size 32" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc to see torch load")
def test_ctrl_c_in_the_first_seconds_of_a_real_process_says_nothing_was_generated():
    # a real SIGINT once torch's libraries are mapped, i.e. while main.py imports the engine: one line
    # (whichever part of the start it lands in), exit code 130, no traceback
    import subprocess
    import time
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(root / "main.py"), "generate", "--prompt", "hi", "--json"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with open(f"/proc/{proc.pid}/maps") as maps:
                if "libtorch" in maps.read():
                    break
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == "", (proc.returncode, out, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == GENERATE_NOTE, err
