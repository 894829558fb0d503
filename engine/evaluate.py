"""Perplexity of a model on a text, and top-1 agreement with a reference model (quantisation quality)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EvalResult:
    tokens: int
    perplexity: float
    reference_perplexity: float | None = None
    top1_agreement: float | None = None      # share of positions where both models rank the same token first
    mean_cosine: float | None = None         # mean cosine similarity of the logit vectors


def windows(ids: list[int], window: int) -> list[list[int]]:
    """Non-overlapping windows of ``window`` tokens (the last may be shorter, at least 2)."""
    return [ids[i:i + window] for i in range(0, len(ids), window) if len(ids[i:i + window]) >= 2]


def _nll(logits: torch.Tensor, ids: list[int]) -> tuple[float, int]:
    target = torch.tensor(ids[1:])
    lp = torch.log_softmax(logits[:-1].float(), -1)
    return float(-lp.gather(1, target[:, None]).sum()), len(ids) - 1


def evaluate(engine, text: str, reference=None, window: int = 256, max_tokens: int | None = None) -> EvalResult:
    """``engine`` and ``reference`` are LLMEngine instances; the text is tokenised by ``engine``."""
    ids = engine.tokenizer.encode(text)[: max_tokens or None]
    nll = ref_nll = agree = 0.0
    cos_sum, n, rows = 0.0, 0, 0
    for w in windows(ids, window):
        logits = engine.score(w)                                        # [T, V]
        a, k = _nll(logits, w)
        nll, n = nll + a, n + k
        if reference is not None:
            ref = reference.score(w)
            ref_nll += _nll(ref, w)[0]
            agree += float((logits.argmax(-1) == ref.argmax(-1)).sum())
            cos_sum += float(torch.nn.functional.cosine_similarity(logits, ref, dim=-1).sum())
            rows += logits.shape[0]
    if n == 0:
        from engine.errors import ConfigError
        raise ConfigError("the evaluation text has fewer than 2 tokens; give a longer text file")
    if reference is None:
        return EvalResult(n, math.exp(nll / n))
    return EvalResult(n, math.exp(nll / n), math.exp(ref_nll / n), agree / rows, cos_sum / rows)
