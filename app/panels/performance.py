"""Throughput (decode and aggregate tok/s) and latency (TTFT, step time)."""
from __future__ import annotations

import time
from typing import Any

from app.panels.base import Panel, Ring, curve, fit_y, make_plot, set_series


def fmt_ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms"


class PerformancePanel(Panel):
    title = "Throughput and latency"

    def __init__(self) -> None:
        super().__init__([("decode", "Decode / stream"), ("aggregate", "Aggregate"),
                          ("ttft", "Last TTFT"), ("step", "Step time")])
        self.speed = Ring(3)     # decode, aggregate, prefill tok/s
        self.latency = Ring(2)   # ttft ms, step ms
        p1 = make_plot(self.graphics, "Tokens per second", "tok/s", 0)
        # the aggregate first and the stream's speed dashed over it: with one stream they are the same line
        self._aggregate = curve(p1, "green", "aggregate", width=2.4)
        self._decode = curve(p1, "blue", "decode / stream", dash=True)
        p2 = make_plot(self.graphics, "Latency", "ms", 1)
        self._ttft = curve(p2, "amber", "TTFT")
        self._step = curve(p2, "cyan", "step")
        self.plots = (p1, p2)

    def push_stats(self, s: Any, now: float | None = None) -> None:
        """One EngineStats snapshot."""
        now = time.perf_counter() if now is None else now
        self.speed.append(now, s.decode_tok_s, s.aggregate_tok_s, s.prefill_tok_s)
        self.latency.append(now, s.ttft_ms, s.step_ms)
        self.readouts["decode"].set(f"{s.decode_tok_s:.1f} tok/s")
        self.readouts["aggregate"].set(f"{s.aggregate_tok_s:.1f} tok/s")
        self.readouts["ttft"].set(fmt_ms(s.ttft_ms))
        self.readouts["step"].set(fmt_ms(s.step_ms or None))        # no step yet: "—", as TTFT
        self.dirty = True

    def _render(self, now: float) -> None:
        rows = self.speed.view()
        set_series(self._decode, rows, 0, now)
        set_series(self._aggregate, rows, 1, now)
        fit_y(self.plots[0], rows[:, 1:3])
        rows = self.latency.view()
        set_series(self._ttft, rows, 0, now)
        set_series(self._step, rows, 1, now)
        fit_y(self.plots[1], rows[:, 1:3])
