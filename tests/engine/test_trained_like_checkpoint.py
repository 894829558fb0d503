"""benchmarks/trained_like_checkpoint.py: the benchmarks' skewed-routing model as a folder both engines of the
llama.cpp kit read, experts one tensor per projection, numerically the model it was built from."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from engine import LLM

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 250, 18]


def test_the_folder_loads_in_strata_as_transformers_reads_it(tmp_path):
    out = tmp_path / "trained"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trained_like_checkpoint.py"), str(out), "--smoke"],
                   check=True, cwd=ROOT, capture_output=True, timeout=600)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in index and not any("gate_up_proj" in n for n in index)
    record = json.loads((out / "trained_like.json").read_text())
    assert record["routing"] == "trained-like" and record["measured"]["top10_share"] > 0.25   # uniform: about 0.1
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].float()
    with LLM(str(out), device="cpu", dtype="float32") as llm:
        got = llm.score(PROMPT)
    assert (got - want).abs().max().item() <= 1e-4


def test_an_existing_folder_is_left_alone(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trained_like_checkpoint.py"), str(tmp_path / "mine"),
                        "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "exists" in r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
