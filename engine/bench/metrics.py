"""What one streamed request saw, and the figures a run reports from all of them.

Every time is ``time.perf_counter()`` seconds, taken where the output arrived: in the engine loop's
sink for in-process runs, as each server-sent event is read for HTTP runs.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """One request as the client saw it. ``arrivals`` holds (time, tokens) per piece of output that
    carried tokens (an engine delta, or a server-sent chunk with text)."""

    index: int
    sent_at: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals[0][0] - self.sent_at if self.arrivals else None

    def inter_token_s(self) -> list[float]:
        """Gaps between consecutive pieces of output, each shared evenly by the tokens of the later piece."""
        out: list[float] = []
        for (t0, _), (t1, n) in zip(self.arrivals, self.arrivals[1:]):
            out += [(t1 - t0) / max(n, 1)] * max(n, 1)
        return out

    def stream_tok_s(self) -> float | None:
        """The speed this stream was decoded at: tokens after the first over the time from first to last."""
        if len(self.arrivals) < 2 or self.output_tokens < 2:
            return None
        span = self.arrivals[-1][0] - self.arrivals[0][0]
        return (self.output_tokens - 1) / span if span > 0 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between the closest ranks; None if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is between 0 and 100 (got {q})")
    if not values:
        return None
    xs = sorted(values)
    rank = q / 100 * (len(xs) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


@dataclass(frozen=True)
class Summary:
    """The client-side figures of one run (times in ms, speeds in tokens per second)."""

    requests: int
    failed: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    output_tok_s: float              # all output tokens over the wall time
    stream_tok_s: float | None       # mean over requests of (tokens - 1) / (last token - first token)
    ttft_mean_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    first_error: str | None = None


def summarise(records: Sequence[RequestRecord], wall_s: float) -> Summary:
    ok = [r for r in records if r.error is None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in r.inter_token_s()]
    speeds = [s for r in ok if (s := r.stream_tok_s()) is not None]
    out = sum(r.output_tokens for r in records)
    failed = [r for r in records if r.error is not None]
    return Summary(requests=len(records), failed=len(failed), prompt_tokens=sum(r.prompt_tokens for r in records),
                   output_tokens=out, wall_s=wall_s, output_tok_s=out / wall_s if wall_s > 0 else 0.0,
                   stream_tok_s=_mean(speeds), ttft_mean_ms=_ms(_mean(ttft)), ttft_p50_ms=_ms(percentile(ttft, 50)),
                   ttft_p99_ms=_ms(percentile(ttft, 99)), itl_p50_ms=_ms(percentile(itl, 50)),
                   itl_p99_ms=_ms(percentile(itl, 99)), first_error=failed[0].error if failed else None)
