"""The bundled demo model (resources/models/demo): loads in transformers, is marked, fits, and has learned.

The held-out sample (resources/models/demo_heldout.txt) is the start of the corpus's test split, which
the model never trained on. The baseline is a unigram model fitted on the sample itself: no unigram
model can do better on it, so beating it by a wide margin shows the model uses context.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

MODELS = Path(__file__).resolve().parents[2] / "resources" / "models"
DEMO = MODELS / "demo"
HELDOUT = MODELS / "demo_heldout.txt"
WEIGHTS_LIMIT_BYTES = 12_000_000
FOLDER_LIMIT_BYTES = 12 * 1024 * 1024


@pytest.fixture(scope="module")
def marker() -> dict:
    return json.loads((DEMO / "STRATA_DEMO.json").read_text())


@pytest.fixture(scope="module")
def model():
    return transformers.AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.bfloat16).float().eval()


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(DEMO)


def test_marker_says_demo_and_trained(marker):
    assert marker["demo"] is True
    assert marker["random_weights"] is False
    assert marker["architecture"] == "Qwen3MoeForCausalLM"


def test_fits_the_size_limit():
    assert (DEMO / "model.safetensors").stat().st_size <= WEIGHTS_LIMIT_BYTES
    assert sum(f.stat().st_size for f in DEMO.iterdir() if f.is_file()) <= FOLDER_LIMIT_BYTES


def test_config_is_a_sparse_qwen3_moe(model):
    cfg = json.loads((DEMO / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe"
    assert cfg["num_experts"] == cfg["num_local_experts"] >= 16  # Hub spelling and transformers 5 spelling
    assert cfg["num_experts_per_tok"] == 2
    assert model.config.tie_word_embeddings
    assert next(model.parameters()).dtype == torch.float32  # loaded from bf16 and upcast for the check


def test_tokenizer_round_trips_and_has_template(tokenizer):
    text = "God said, “Let there be light,” and there was light."
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 0
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@torch.no_grad()
def test_heldout_perplexity_far_below_unigram(model, tokenizer):
    ids = torch.tensor([tokenizer(HELDOUT.read_text(encoding="utf-8")).input_ids])
    assert ids.shape[1] > 300
    logits = model(input_ids=ids).logits[0, :-1]
    targets = ids[0, 1:]
    ppl = math.exp(float(torch.nn.functional.cross_entropy(logits, targets)))
    counts = torch.bincount(targets, minlength=model.config.vocab_size).double()
    probs = counts[targets] / counts.sum()
    unigram_ppl = math.exp(float(-probs.log().mean()))  # unigram fitted on the sample itself
    assert ppl < 0.5 * unigram_ppl, (ppl, unigram_ppl)
    assert ppl < 60, ppl
