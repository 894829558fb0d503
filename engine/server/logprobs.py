"""Log-probabilities in OpenAI's two shapes (legacy completions, chat), and a prompt's own from scoring."""
from __future__ import annotations

import codecs
from collections.abc import Sequence

import torch

from engine.outputs import TokenLogprob
from engine.server.engine_client import ModelInfo

FLOOR = -9999.0          # -inf is not JSON; a token the model rules out reads as this


def _f(v: float) -> float:
    return v if v > FLOOR else FLOOR


def pad(ids: Sequence[int], lps: Sequence[TokenLogprob]) -> list[TokenLogprob | None]:
    """One entry per token id (None where the engine reported none)."""
    return list(lps[:len(ids)]) + [None] * (len(ids) - len(lps))


def prompt_logprobs(logits: torch.Tensor, ids: Sequence[int], k: int) -> list[TokenLogprob | None]:
    """Each prompt token's logprob given the tokens before it (the first has none) and the ``k``
    likeliest tokens at its place, from the prompt's logits [T, V]."""
    if len(ids) < 2:
        return [None] * len(ids)
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)                            # [T-1, V]
    nxt = torch.tensor(list(ids[1:]), dtype=torch.long)                              # [T-1]
    chosen = logp.gather(1, nxt.unsqueeze(1)).squeeze(1).tolist()                    # [T-1]
    if k > 0:
        top_v, top_i = logp.topk(k, dim=-1)                                          # [T-1, k]
        tops = [tuple(zip(i, v)) for i, v in zip(top_i.tolist(), top_v.tolist())]
    else:
        tops = [()] * len(chosen)
    return [None] + [TokenLogprob(t, lp, top) for t, lp, top in zip(ids[1:], chosen, tops)]


class TextOffsets:
    """Where each token starts in a completion's text, in characters: tokens go through a UTF-8 decoder
    that keeps the bytes of a character split over several tokens until it is whole, so such tokens start
    where that character does, and the next token one character later."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def take(self, token_bytes: bytes) -> int:
        """The offset of a token of ``token_bytes``; moves past the characters it completes."""
        at = self.offset
        self.offset += len(self._decoder.decode(token_bytes))
        return at


def legacy(ids: Sequence[int], lps: Sequence[TokenLogprob | None], info: ModelInfo, offsets: TextOffsets,
           echoed: str | None = None) -> dict:
    """The completions shape for ``ids``, text offsets counted on from ``offsets`` (which moves on).
    A reply's text leaves special tokens out, so they take no room in it; an echoed prompt (``echoed``, its
    text) spells those it was written with, not those the tokenizer added (a BOS before a text prompt)."""
    tokens, token_lps, tops, at = [], [], [], []
    for tid, lp in zip(ids, lps):
        tokens.append(info.token_text(tid))
        token_lps.append(None if lp is None else _f(lp.logprob))
        tops.append(None if lp is None else _legacy_top(lp, info))
        room = info.text_bytes(tid)
        if echoed is not None and not room and echoed.startswith(info.token_text(tid), offsets.offset):
            room = info.token_bytes(tid)        # a special token the prompt's text spells
        at.append(offsets.take(room))
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": at}


def _legacy_top(lp: TokenLogprob, info: ModelInfo) -> dict[str, float]:
    """The likeliest tokens, and the chosen one when it is not among them (k + 1 entries at most, as OpenAI
    and vLLM give them; chat lists exactly k, since its entry names the chosen token itself)."""
    top = {info.token_text(i): _f(v) for i, v in lp.top}
    if all(i != lp.token_id for i, _ in lp.top):
        top.setdefault(info.token_text(lp.token_id), _f(lp.logprob))
    return top


def merge_legacy(parts: Sequence[dict]) -> dict:
    return {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat(ids: Sequence[int], lps: Sequence[TokenLogprob | None], info: ModelInfo) -> list[dict]:
    """The chat shape's ``content`` entries for ``ids``."""
    out = []
    for tid, lp in zip(ids, lps):
        top = [] if lp is None else [_entry(info, i, v) for i, v in lp.top]
        out.append({**_entry(info, tid, None if lp is None else lp.logprob), "top_logprobs": top})
    return out


def _entry(info: ModelInfo, token_id: int, logprob: float | None) -> dict:
    return {"token": info.token_text(token_id), "logprob": None if logprob is None else _f(logprob),
            "bytes": list(info.token_bytes(token_id))}
