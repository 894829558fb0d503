"""Expert residency: hit rate over time, hit rate per layer, and a layer × expert activation heatmap."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyqtgraph as pg

from app.panels.base import COLORS, Panel, Ring, curve, make_plot, set_series


class ExpertPanel(Panel):
    title = "Experts"

    def __init__(self) -> None:
        super().__init__([("hit", "Hit rate"), ("slots", "Pool slots"), ("prefetch", "Prefetch hits"),
                          ("misses", "Misses"), ("gpu_prefetch", "GPU prefetch"), ("policy", "Eviction")])
        self.rate = Ring(1)
        self._layers: np.ndarray = np.zeros(0)
        self._heat: np.ndarray = np.zeros((0, 0))
        self._shown_shape: tuple | None = None
        p1 = make_plot(self.graphics, "Expert hit rate", "%", 0)
        p1.setYRange(0, 100, padding=0.02)
        self._rate = curve(p1, "green", "all layers")
        p2 = self.graphics.addPlot(row=1, col=0)
        p2.setTitle("<span style='color:#c9d1d9;font-size:9pt'>Hit rate per MoE layer</span>")
        p2.setLabel("left", "%")
        p2.setLabel("bottom", "layer")
        p2.setYRange(0, 100, padding=0.02)
        p2.setMouseEnabled(x=False, y=False)
        p2.hideButtons()
        p2.disableAutoRange()
        self._bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=COLORS["blue"])
        p2.addItem(self._bars)
        p3 = self.graphics.addPlot(row=2, col=0)
        p3.setTitle("<span style='color:#c9d1d9;font-size:9pt'>Routed tokens per expert (row = layer)</span>")
        p3.setLabel("left", "layer")
        p3.setLabel("bottom", "expert")
        p3.setMouseEnabled(x=False, y=False)
        p3.hideButtons()
        p3.invertY(True)
        p3.disableAutoRange()
        self._image = pg.ImageItem(axisOrder="row-major")
        self._image.setColorMap(pg.colormap.get("inferno"))
        p3.addItem(self._image)
        self.plots = (p1, p2, p3)

    def push_stats(self, s: Any, now: float | None = None) -> None:
        """One EngineStats snapshot."""
        now = time.perf_counter() if now is None else now
        e = s.experts
        total = e.hits + e.misses
        self.rate.append(now, 100.0 * e.hit_rate if total else None)
        r = self.readouts
        r["hit"].set(f"{100.0 * e.hit_rate:.1f}%" if total else "—", f"{e.hits} hits, {e.misses} misses")
        r["slots"].set(f"{e.pool_slots_used}/{e.pool_slots_total}" if e.pool_slots_total else "—")
        r["prefetch"].set(str(e.prefetch_hits), f"{e.prefetch_wasted} prefetched and never used")
        r["misses"].set(str(e.misses), f"{e.misses_predicted} of them named by a prediction for their layer "
                        "(the most that prefetching could have hidden)")
        r["gpu_prefetch"].set(*claim_summary(e))
        name, _, memory = e.policy.partition(" ")          # "adaptive 0.99": the memory it uses now
        caption = f"Eviction ({memory})" if memory else "Eviction"
        if r["policy"].caption.text() != caption:
            r["policy"].caption.setText(caption)
        r["policy"].set(name or "—", POLICY_TIPS.get(name, "Every expert stays on the GPU"))
        self._layers = np.asarray(e.per_layer_hit_rate, dtype=float) * 100.0
        if e.activations:
            self._heat = np.asarray(e.activations, dtype=float)
        self.dirty = True

    def _render(self, now: float) -> None:
        set_series(self._rate, self.rate.view(), 0, now)
        n = len(self._layers)
        self._bars.setOpts(x=np.arange(n), height=self._layers, width=0.7)
        if self._shown_shape != (n, self._heat.shape):     # fixed ranges: no auto-range pass per redraw
            self._shown_shape = (n, self._heat.shape)
            self.plots[1].setXRange(-0.5, max(n, 1) - 0.5, padding=0.02)
            rows, cols = self._heat.shape if self._heat.size else (1, 1)
            self.plots[2].setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        if self._heat.size:
            # normalise each layer so a quiet layer's favourite experts still stand out
            peak = self._heat.max(axis=1, keepdims=True)
            self._image.setImage(self._heat / np.where(peak > 0, peak, 1.0), levels=(0.0, 1.0), autoLevels=False)


POLICY_TIPS = {
    "lfu": "Least frequently used goes first; each use decays by 0.9 per step",
    "lru": "Least recently used goes first",
    "adaptive": ("LFU with a short (0.9) and a long (0.99) memory; the one in brackets picks the victims now: "
                 "whichever would have kept more of the experts used lately"),
    "static": "A fixed placement from a routing profile; nothing placed is evicted",
}


def claim_summary(e: Any) -> tuple[str, str]:
    """The GPU-side prefetch of direct-read decode steps as a readout: text and tooltip."""
    if not e.claim_use:
        return "—", ("The GPU copies predicted experts in by itself in decode steps that read missing experts "
                      "straight from host memory (CUDA, prefetch depth 1 or more, part of the experts offloaded)")
    text = ", ".join(f"{label} tok {'on' if n else 'paused'}" for label, _, n in e.claim_use)
    lines = []
    for label, share, n in e.claim_use:
        used = "too few claims yet to tell" if share is None else f"first claims used {100 * share:.0f}%"
        state = (f"{n} claim{'s' * (n != 1)} per layer" if n else
                 f"paused below {100 * e.claim_threshold:.0f}%, probed now and then")
        lines.append(f"steps of {label} token{'s' * (label != '1')}: {used}; {state}")
    return text, "\n".join(lines)
