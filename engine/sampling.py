"""Sampling parameters and the batched sampler."""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from engine.errors import ConfigError
from engine.guided import Guide
from engine.host_copy import host_to

MAX_LOGPROBS = 20          # likeliest alternatives a request may ask for at each position


class AnswerGate(Protocol):
    """One request's reading of its reply: fed every output token in order, it says whether the token's
    text is the answer's (stop strings apply to that text alone); ``next_in_answer`` says whether the
    next token will be (where the scope ``holds_guide``, a guide applies from there on: the reasoning
    before the answer is the model's own)."""

    def in_answer(self, token: int) -> bool: ...

    def next_in_answer(self) -> bool: ...


class StopScope(Protocol):
    """Where stop strings apply in a reply: a fresh :class:`AnswerGate` per request, and the characters each
    run of answer text sheds at its start (as the reply's reader does, so that a stop is matched in the
    text it shows as the answer). A scope may also say ``holds_guide`` (True): the request's guide then
    applies from the answer's first token on (engine.request.Request.guide_on)."""

    lead: str

    def gate(self) -> AnswerGate: ...


GREEDY_BELOW = 1e-5      # a temperature this small samples greedily (SamplingParams.greedy)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request. ``temperature=0`` (or below ``GREEDY_BELOW``) means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1.0 = off
    min_p: float = 0.0              # 0.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off; applied to prompt and generated tokens (HF semantics)
    seed: int | None = None
    stop: tuple[str, ...] = ()      # stop strings; not included in the output text
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False        # keep going past the model's end-of-sequence tokens
    include_stop_str_in_output: bool = False
    logprobs: int | None = None     # report each chosen token's logprob and this many likeliest alternatives
    guide: Guide | None = None      # constrain the output to a grammar (engine/guided.py)
    # where stop strings begin to apply: a reasoning format's answer (engine.chat_format: ThinkTags and
    # HarmonyChat make one for a prompt); None: the whole output. See :class:`StopScope`.
    stop_scope: StopScope | None = None

    def __post_init__(self) -> None:
        # Every field is checked here, once per request, so the sampler never meets a value it cannot use.
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        put("stop", _stop_strings(self.stop))
        put("stop_token_ids", _token_ids(self.stop_token_ids))
        put("max_tokens", _whole("max_tokens", self.max_tokens, 1, "a reply needs at least 1 token"))
        put("top_k", _whole("top_k", self.top_k, 0, "0 turns it off"))
        put("temperature", _number("temperature", self.temperature, lambda v: v >= 0, ">= 0", "0 is greedy"))
        put("top_p", _number("top_p", self.top_p, lambda v: 0.0 < v <= 1.0, "in (0, 1]", "1 turns it off"))
        put("min_p", _number("min_p", self.min_p, lambda v: 0.0 <= v < 1.0, "in [0, 1)", "0 turns it off"))
        put("repetition_penalty", _number("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0",
                                          "1 turns it off"))
        put("seed", _seed(self.seed))
        _flag("ignore_eos", self.ignore_eos)
        _flag("include_stop_str_in_output", self.include_stop_str_in_output)
        put("logprobs", _logprobs(self.logprobs))
        if self.stop_scope is not None and not callable(getattr(self.stop_scope, "gate", None)):
            raise ConfigError(f"stop_scope must have a gate() method or be None (got {type(self.stop_scope).__name__})")
        if self.guide is not None and not isinstance(self.guide, Guide):
            raise ConfigError(f"guide must be a Guide from engine.guided or None (got {type(self.guide).__name__}); "
                              "build one with Guide(kind, spec)")

    @property
    def greedy(self) -> bool:
        """Temperatures below :data:`GREEDY_BELOW` pick the likeliest token: dividing the logits by one
        would overflow them (1e-40 is 0 in float32), and the result is greedy anyway."""
        return self.temperature < GREEDY_BELOW


def _whole(name: str, value: object, minimum: int, hint: str) -> int:
    """``value`` as an int (numpy integers included; bools are not numbers here), or a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum} (got {value!r}); {hint}")
    return int(value)


def _number(name: str, value: object, ok: Callable[[float], bool], expected: str, hint: str) -> float:
    """``value`` as a finite float that passes ``ok``, or a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
        raise ConfigError(f"{name} must be a number {expected} (got {value!r}); {hint}")
    return float(value)


def _seed(value: object) -> int | None:
    # torch generators take any 64-bit seed, signed or not
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not -2 ** 63 <= value < 2 ** 64:
        raise ConfigError(f"seed must be a whole number that fits in 64 bits (got {value!r}); "
                          "leave the seed out (None) to draw a fresh random seed")
    return int(value)


def _logprobs(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= MAX_LOGPROBS:
        raise ConfigError(f"logprobs must be a whole number from 0 to {MAX_LOGPROBS} (got {value!r}); "
                          "0 reports only the chosen tokens, None turns it off")
    return int(value)


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False (got {value!r})")


def _stop_strings(stop: object) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (one string, a sequence of them, or None)."""
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else None
    if strings is None or not all(isinstance(s, str) for s in strings):
        raise ConfigError(f"stop must be a string or a list of strings (got {stop!r})")
    if "" in strings:
        raise ConfigError("stop strings must not be empty; remove the empty one")
    return strings


def _token_ids(ids: object) -> tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple)) or any(
            isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 for t in ids):
        raise ConfigError(f"stop_token_ids must be a list of token ids >= 0 (got {ids!r})")
    return tuple(int(t) for t in ids)


# Sampler. Legend: B rows (requests) in the batch, V vocabulary entries, S rows that sample
# (temperature > 0), H longest repetition-penalty history, G rows with a guide, W bitmask words
# (32 token ids each), L rows that asked for logprobs, N alternatives reported per row.


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator seeded with ``seed`` on ``device``, or None (draw from the global RNG) when unseeded."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    return generator


def apply_repetition_penalty(logits: Tensor, penalties: Sequence[float],
                             histories: Sequence[Sequence[int]]) -> Tensor:
    """Penalise every token id seen in a row's history (prompt and generated); returns a new tensor.

    ``logits`` is float32 [B, V]. A seen token's positive logit is divided by the penalty, a negative
    one multiplied, so a penalty above 1 always makes it less likely.
    """
    rows = [i for i, p in enumerate(penalties) if p != 1.0 and len(histories[i]) > 0]
    if not rows:
        return logits
    width = max(len(histories[i]) for i in rows)
    # Pad each history with its own first id: a repeated id scatters the same value twice.
    padded = [list(histories[i]) + [histories[i][0]] * (width - len(histories[i])) for i in rows]
    ids = host_to(padded, torch.int64, logits.device)                                 # [R, H]
    row_idx = host_to(rows, torch.int64, logits.device)                               # [R]
    penalty = host_to([penalties[i] for i in rows], torch.float32, logits.device).unsqueeze(1)   # [R, 1]
    seen = logits[row_idx].gather(1, ids)                                             # [R, H]
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    logits = logits.clone()
    logits[row_idx] = logits[row_idx].scatter(1, ids, seen)
    return logits


def _filter_sorted(sorted_logits: Tensor, params: Sequence[SamplingParams]) -> Tensor:
    """Mask (to -inf) what top-k, then top-p, then min-p remove; ``sorted_logits`` is [S, V] descending."""
    device = sorted_logits.device
    n_vocab = sorted_logits.shape[1]
    rank = torch.arange(n_vocab, device=device).unsqueeze(0)                          # [1, V]
    top_k = host_to([p.top_k if p.top_k > 0 else n_vocab for p in params], torch.int64, device)
    masked = sorted_logits.masked_fill(rank >= top_k.unsqueeze(1), float("-inf"))      # [S, V]
    probs = masked.softmax(dim=-1)                                                     # [S, V]
    top_p = host_to([p.top_p for p in params], torch.float32, device).unsqueeze(1)
    mass_before = probs.cumsum(dim=-1) - probs                                         # [S, V]
    # A token goes when the more likely tokens already hold top_p of the mass; the first always stays.
    drop = (mass_before >= top_p) & (top_p < 1.0) & (rank > 0)
    masked = masked.masked_fill(drop, float("-inf"))
    min_p = host_to([p.min_p for p in params], torch.float32, device).unsqueeze(1)
    probs = masked.softmax(dim=-1)                                                     # [S, V]
    drop = probs < min_p * probs[:, :1]
    return masked.masked_fill(drop & (rank > 0), float("-inf"))


def _draw(probs: Tensor, generators: Sequence[torch.Generator | None]) -> Tensor:
    """One index per row of ``probs`` [S, V]; each seeded row draws only from its own generator.

    Uses the exponential race (argmax of p / Exp(1)), which samples exactly from ``probs`` and
    needs no device-to-host sync.
    """
    noise = torch.empty_like(probs)                                                    # [S, V]
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    elif unseeded:
        idx = host_to(unseeded, torch.int64, probs.device)
        noise.index_copy_(0, idx, probs.new_empty(len(unseeded), probs.shape[1]).exponential_())
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    # exponential_ may return exactly 0, and 0 / 0 would be a NaN that argmax picks.
    noise.clamp_(min=torch.finfo(torch.float32).tiny)
    return (probs / noise).argmax(dim=-1)                                              # [S]


def sample(logits: Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None],
           histories: Sequence[Sequence[int]] | None = None) -> Tensor:
    """Pick the next token of every row.

    ``logits`` [B, V] of any float dtype (computed in float32); ``params`` and ``generators`` give
    one entry per row; ``histories`` the token ids each row has seen (prompt + generated) for the
    repetition penalty. Order: repetition penalty, temperature, top-k, top-p, min-p. Returns [B] int64.
    """
    if not (len(params) == len(generators) == logits.shape[0]):
        raise ValueError(
            f"sample() got {logits.shape[0]} rows, {len(params)} params and {len(generators)} generators"
        )
    logits = logits.float()                                                            # [B, V]
    if histories is not None:
        logits = apply_repetition_penalty(logits, [p.repetition_penalty for p in params], histories)
    greedy = [p.greedy for p in params]
    if all(greedy):
        return logits.argmax(dim=-1)                                                   # [B]
    if not any(greedy):
        return _draw(warp_logits(logits, params).softmax(dim=-1), generators)          # [B]
    # Mixed: every row argmax, then the sampling rows drawn. Row indices cross as one async copy.
    rows = [i for i, g in enumerate(greedy) if not g]
    idx = host_to(rows, torch.int64, logits.device)                                    # [S]
    probs = warp_logits(logits.index_select(0, idx), [params[i] for i in rows]).softmax(dim=-1)   # [S, V]
    return logits.argmax(dim=-1).index_copy(0, idx, _draw(probs, [generators[i] for i in rows]))


def mask_logits(logits: Tensor, bits: Tensor, rows: Sequence[int]) -> Tensor:
    """``logits`` [B, V] as float32 with the tokens a guide forbids at -inf, in a new tensor.

    ``bits`` int32 [G, W] on the logits' device: bit ``t % 32`` of word ``t // 32`` of row ``g`` is set
    when token ``t`` is allowed in batch row ``rows[g]``; rows not in ``rows`` are left as they are.
    """
    n_vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)                  # [32]
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :n_vocab].bool()    # [G, V]
    logits = logits.float()
    if len(rows) == logits.shape[0]:
        return logits.masked_fill(~allowed, float("-inf"))
    idx = host_to(list(rows), torch.int64, logits.device)                             # [G]
    return logits.index_copy(0, idx, logits.index_select(0, idx).masked_fill(~allowed, float("-inf")))


def token_logprobs(logits: Tensor, tokens: Tensor, rows: Sequence[int], top_n: int) -> tuple[Tensor, Tensor]:
    """Log-probabilities under the raw ``logits`` [B, V] of the chosen ``tokens`` [B] of ``rows``, and
    their ``top_n`` likeliest tokens. Returns float32 [L, 1 + N] (the chosen token's logprob, then the
    N likeliest logprobs in descending order) and int64 [L, N] (those tokens' ids)."""
    if len(rows) == logits.shape[0]:
        picked, chosen = logits, tokens
    else:
        idx = host_to(list(rows), torch.int64, logits.device)                         # [L]
        picked, chosen = logits.index_select(0, idx), tokens.index_select(0, idx)
    lp = picked.float().log_softmax(dim=-1)                                           # [L, V]
    own = lp.gather(1, chosen.unsqueeze(1))                                           # [L, 1]
    if top_n == 0:
        return own, chosen.new_empty(len(rows), 0)
    top = lp.topk(min(top_n, lp.shape[1]), dim=-1)                                    # [L, N]
    return torch.cat([own, top.values], dim=1), top.indices


def warp_logits(logits: Tensor, params: Sequence[SamplingParams]) -> Tensor:
    """Temperature, then top-k, top-p and min-p: float32 ``logits`` [S, V] -> [S, V], removed tokens at -inf.

    Every row must have temperature > 0.
    """
    temperature = host_to([p.temperature for p in params], torch.float32, logits.device).unsqueeze(1)   # [S, 1]
    if not any(_filters(p, logits.shape[1]) for p in params):
        return logits / temperature            # nothing to remove: no sort (a vocabulary-wide sort, scan and
        # two softmaxes cost about 0.4 ms a step at batch 1 on an H200 with a 152k vocabulary)
    sorted_logits, order = (logits / temperature).sort(dim=-1, descending=True)        # [S, V]
    kept = _filter_sorted(sorted_logits, params)                                       # [S, V]
    return torch.empty_like(kept).scatter_(1, order, kept)


def _filters(p: SamplingParams, n_vocab: int) -> bool:
    """Whether top-k, top-p or min-p can remove a token of a row with ``p``."""
    return 0 < p.top_k < n_vocab or p.top_p < 1.0 or p.min_p > 0.0


def check_stop(text_so_far: str, new_text: str, stop: tuple[str, ...]) -> int | None:
    """Where the earliest stop string that ends inside ``new_text`` begins in ``text_so_far + new_text``.

    A stop string may straddle the two; matches lying wholly in ``text_so_far`` were reported before.
    Returns None when no stop string occurs.
    """
    full = text_so_far + new_text
    best: int | None = None
    for s in stop:
        if not s:
            continue
        found = full.find(s, max(0, len(text_so_far) - len(s) + 1))
        if found >= 0 and (best is None or found < best):
            best = found
    return best


def stop_holdback(text: str, stop: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` to hold back because a stop string may start there."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest
