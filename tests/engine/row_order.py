"""A check shared by the families whose q/k rows are reordered at load (GLM's half-head RoPE, DeepSeek's
interleaved rotary pairs): every path that stores those rows must reorder them exactly once."""
from __future__ import annotations

import torch

from engine import LLM
from main import main

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33, 41, 7, 8, 260], [1, 99, 4], [1, 250, 251, 252, 253, 17, 6]]


def cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Mean cosine similarity of two lists of logit rows."""
    return float(torch.nn.functional.cosine_similarity(torch.cat(a), torch.cat(b), dim=-1).mean())


def check_8bit_rows_keep_the_order(folder, tmp_path) -> None:
    """8-bit rows quantised at load and those a converted folder stores (quantised in the checkpoint's
    order) give what the float model does; rows left in the checkpoint's order would not (about 0.78)."""
    reference = LLM(str(folder), device="cpu").engine.score_batch(PROMPTS)
    at_load = LLM(str(folder), device="cpu", resident_weights="int8").engine.score_batch(PROMPTS)
    assert cosine(at_load, reference) >= 0.99
    dst = tmp_path / "int4"
    assert main(["convert", str(folder), str(dst), "--weights", "int4", "--resident-weights", "int8"]) == 0
    converted = LLM(str(dst), device="cpu").engine.score_batch(PROMPTS)
    quantised = LLM(str(folder), device="cpu", weight_format="int4", resident_weights="int8").engine.score_batch(PROMPTS)
    # the folder's 8-bit rows come from the float32 source, those made at load from the same: close, not equal
    assert cosine(converted, quantised) >= 0.99
    assert cosine(converted, reference) >= 0.95
