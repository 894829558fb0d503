"""The command line as a user runs it: generate --json, info with a GPU budget."""
from __future__ import annotations

import json

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
