"""What the engine hands back: per-step deltas for streaming and whole results for ``generate``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one chosen token under the model, and the likeliest tokens at its place."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()   # (token id, logprob), most likely first; as many as asked for


@dataclass(frozen=True)
class RequestDelta:
    """New output of one request in one engine step (what a streaming client shows)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str                      # detokenised text since the previous delta (never half a character)
    finished: bool
    finish_reason: str | None = None   # "stop" | "length" | "abort" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None       # set on the delta that carries the first token
    error: str | None = None           # one line, when finish_reason == "error"
    logprobs: tuple[TokenLogprob, ...] = ()   # one per new token id, when the request asked for logprobs
    stop_string: bool = False          # finished: one of the request's stop strings ended it (not the model)


@dataclass(frozen=True)
class RequestOutput:
    """A finished request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    ttft_ms: float | None = None
    decode_tok_s: float | None = None
    metrics: dict = field(default_factory=dict)
    logprobs: tuple[TokenLogprob, ...] = ()   # one per token id, when the request asked for logprobs
    error: str | None = None                  # one line, when finish_reason == "error"
