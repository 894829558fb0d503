"""Perplexity of a model on a text, and top-1 agreement with a reference model (quantisation quality).

The reference runs its experts in a dense format: its own dtype, or — for a checkpoint that ships MXFP4
experts, which have no unquantised original — their values dequantised to bf16 (exact). So an MXFP4
checkpoint compared with itself measures the MXFP4 kernels, and an int4 conversion of it measures what
the int4 quantisation lost against the weights as shipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint.converted import is_converted
from engine.checkpoint.spec import read_spec
from engine.errors import ConfigError


@dataclass(frozen=True)
class EvalResult:
    tokens: int
    perplexity: float
    reference_perplexity: float | None = None
    top1_agreement: float | None = None      # share of positions where both models rank the same token first
    mean_cosine: float | None = None         # mean cosine similarity of the logit vectors
    expert_format: str = ""                  # the experts as run: bf16, int4, fp8, mxfp4, ...
    reference_format: str | None = None      # the reference's experts as run
    resident_format: str = "bf16"            # the resident matrices as run: bf16 (the dtype), fp8, int8
    text_tokens: int = 0                     # the text's tokens: ``tokens`` less each window's first (context only)


def _resident_as_run(engine) -> str:
    """The resident matrices' format as run: the loader's "bf16" stands for the dtype, named here."""
    res = engine.model_info.resident_format
    if res != "bf16":
        return res
    dtype = getattr(getattr(engine, "loaded", None), "dtype", None)
    return {torch.float32: "fp32", torch.float16: "fp16"}.get(dtype, "bf16")


def reference_weight_format(model: str) -> str:
    """``weight_format`` to load a reference model with: as stored, but MXFP4 experts and fp8 ones with block
    scales dequantised to bf16.

    A converted folder holds one format only, so it loads as stored.
    """
    folder = Path(model)
    if is_converted(folder) or read_spec(folder).expert_storage not in ("mxfp4", "fp8"):
        return "auto"
    return "bf16"


def windows(ids: list[int], window: int) -> list[list[int]]:
    """Non-overlapping windows of ``window`` tokens (the last may be shorter, at least 2)."""
    return [ids[i:i + window] for i in range(0, len(ids), window) if len(ids[i:i + window]) >= 2]


def _nll(logits: torch.Tensor, ids: list[int]) -> tuple[float, int]:
    target = torch.tensor(ids[1:])
    lp = torch.log_softmax(logits[:-1].float(), -1)
    return float(-lp.gather(1, target[:, None]).sum()), len(ids) - 1


def check_eval(engine, reference, window: int, max_tokens: int | None) -> None:
    """Refuse settings that cannot score anything, or models that cannot be compared, before any work."""
    if window < 2:
        raise ConfigError(f"window {window} is too small; a window scores its tokens after the first, so give at least 2")
    if max_tokens is not None and max_tokens < 2:
        raise ConfigError(f"max_tokens {max_tokens} is too small; give at least 2, or None to score the whole text")
    if reference is not None and reference.loaded.spec.vocab_size != engine.loaded.spec.vocab_size:
        raise ConfigError(f"the reference {reference.model_info.name} has a vocabulary of "
                          f"{reference.loaded.spec.vocab_size} tokens but {engine.model_info.name} has "
                          f"{engine.loaded.spec.vocab_size}; compare with a reference of the same model "
                          "(e.g. its unquantised source)")


def _check_context(engine, reference, longest: int, window: int) -> None:
    """``longest``: the window a text of its length takes (``window``, or the whole text if shorter)."""
    size = f"{window} tokens" if longest == window else f"{window} tokens (all {longest} of this text)"
    for e in (engine, reference) if reference is not None else (engine,):
        context = e.loaded.max_model_len
        if longest > context:
            raise ConfigError(f"a window of {size} does not fit the context of {e.model_info.name} "
                              f"({context} tokens); choose a window (--window) of at most {context}")


def evaluate(engine, text: str, reference=None, window: int = 256, max_tokens: int | None = None) -> EvalResult:
    """``engine`` and ``reference`` are LLMEngine instances; the text is tokenised by ``engine``."""
    check_eval(engine, reference, window, max_tokens)
    if engine.tokenizer is None:
        raise ConfigError("this model has no tokenizer, so a text cannot be scored; load a model folder with one")
    ids = engine.tokenizer.encode(text)[:max_tokens]
    _check_context(engine, reference, min(window, len(ids)), window)
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
        raise ConfigError("the evaluation text has fewer than 2 tokens; give a longer text file")
    fmt, res = engine.model_info.expert_format, _resident_as_run(engine)
    if reference is None:
        return EvalResult(n, math.exp(nll / n), expert_format=fmt, resident_format=res, text_tokens=len(ids))
    return EvalResult(n, math.exp(nll / n), math.exp(ref_nll / n), agree / rows, cos_sum / rows, fmt,
                      reference.model_info.expert_format, res, len(ids))
