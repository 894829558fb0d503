"""``bench --json``: the file's ``config`` holds the workload the run used, as the printed header says it, not
the flags as typed (a flag left out once read ``"seed": null`` while the header said ``seed 0``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from main import main

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"


@pytest.mark.parametrize("flags,seed", [([], 0), (["--seed", "7"], 7)], ids=["seed-left-out", "seed-given"])
def test_the_json_config_and_the_header_name_the_same_workload(tmp_path, capsys, flags, seed):
    out = tmp_path / "run.json"
    argv = ["bench", "--model", str(DEMO), "--device", "cpu", "--requests", "2", "--prompt-len", "6",
            "--output-len", "3", *flags, "--json", str(out)]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == f"bench      custom: 2 requests, prompt 6, output 3, concurrency 8, seed {seed}"
    data = json.loads(out.read_text())
    config, workload = data["config"], data["workload"]
    assert config["seed"] == workload["seed"] == seed
    assert config["temperature"] == workload["temperature"] == 0.0
    assert config["requests"] == workload["num_requests"] == 2
    assert config["concurrency"] == workload["concurrency"] == 8 and config["request_rate"] is None
    assert (config["prompt_len"], config["output_len"]) == ("6", "3")
    assert config["warmup"] == 2                      # the concurrency, at most --requests
    assert config["device"] == "cpu" and config["model"] == str(DEMO)
