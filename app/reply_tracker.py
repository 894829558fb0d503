"""Per-reply measurements (TTFT, prompt and decode speed, expert hit rate during the reply).

Pure bookkeeping on host clocks; fed by the bridge with the engine's deltas and counters.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.messages import ReplyStats


@dataclass
class _Live:
    tag: str
    started: float
    hits0: int
    misses0: int
    first_token_at: float | None = None
    last_token_at: float | None = None
    ttft_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ReplyTracker:
    """Follows every request in flight from submission to its finish."""

    def __init__(self) -> None:
        self._live: dict[str, _Live] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._live

    def ids(self) -> list[str]:
        return list(self._live)

    def start(self, request_id: str, tag: str, hits: int, misses: int, now: float) -> None:
        """A request was handed to the engine; ``hits``/``misses`` are the engine's counters now."""
        self._live[request_id] = _Live(tag=tag, started=now, hits0=hits, misses0=misses)

    def on_tokens(self, request_id: str, new_tokens: int, prompt_tokens: int, completion_tokens: int,
                  ttft_ms: float | None, now: float) -> None:
        """A delta arrived for ``request_id`` carrying ``new_tokens`` sampled tokens."""
        live = self._live.get(request_id)
        if live is None:
            return
        if new_tokens and live.first_token_at is None:
            live.first_token_at = now
        if new_tokens:
            live.last_token_at = now
        if ttft_ms is not None and live.ttft_ms is None:
            live.ttft_ms = ttft_ms
        live.prompt_tokens = max(live.prompt_tokens, prompt_tokens)
        live.completion_tokens = max(live.completion_tokens, completion_tokens)

    def finish(self, request_id: str, reason: str, hits: int, misses: int, now: float,
               error: str | None = None) -> ReplyStats | None:
        """The request ended; returns its stats (None if it was not being tracked)."""
        live = self._live.pop(request_id, None)
        if live is None:
            return None
        ttft = live.ttft_ms
        if ttft is None and live.first_token_at is not None:
            ttft = (live.first_token_at - live.started) * 1000.0
        prompt_s = None
        if ttft and live.prompt_tokens:
            prompt_s = live.prompt_tokens / (ttft / 1000.0)
        decode_s = None
        if live.first_token_at is not None and live.last_token_at is not None and live.completion_tokens > 1:
            span = max(live.last_token_at - live.first_token_at, 1e-6)
            decode_s = (live.completion_tokens - 1) / span
        d_hits, d_misses = hits - live.hits0, misses - live.misses0
        hit_rate = d_hits / (d_hits + d_misses) if d_hits + d_misses > 0 else None
        return ReplyStats(
            request_id=request_id, tag=live.tag, finish_reason=reason,
            prompt_tokens=live.prompt_tokens, completion_tokens=live.completion_tokens,
            ttft_ms=ttft, prompt_tok_s=prompt_s, decode_tok_s=decode_s, expert_hit_rate=hit_rate,
            started=live.started, finished=now, error=error)
