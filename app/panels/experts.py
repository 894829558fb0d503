"""Expert residency: hit rates over time, hit rate per layer, and a layer × expert activation heatmap.

A needed expert is a hit when it is on the GPU as its layer runs: a *pool* hit when it was resident
already, a *staging* hit when a prefetch copied it into a staging slot in time. Every readout says
which it counts and since when, and shows "—" until the model has routed a token.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF

from app.panels.base import COLORS, Panel, Ring, curve, make_plot, set_series
from app.panels.plot_title import set_title


RECENT_S = 2.0       # the window of the "last 2 s" rates
NONE_YET = "—"


@dataclass(frozen=True)
class HitCounts:
    """Cumulative counts of needed experts, split by where they were found."""

    pool: int = 0          # resident in the pool already
    staging: int = 0       # brought into a staging slot by a prefetch in time
    misses: int = 0

    @classmethod
    def of(cls, e: Any) -> "HitCounts":
        return cls(max(e.hits - e.prefetch_hits, 0), e.prefetch_hits, e.misses)

    @property
    def needed(self) -> int:
        return self.pool + self.staging + self.misses

    def minus(self, earlier: "HitCounts") -> "HitCounts":
        return HitCounts(self.pool - earlier.pool, self.staging - earlier.staging, self.misses - earlier.misses)

    def share(self, part: int) -> float | None:
        """``part`` in percent of the needed experts; None before any was needed."""
        return 100.0 * part / self.needed if self.needed > 0 else None


def pct(value: float | None) -> str:
    return NONE_YET if value is None else f"{value:.1f}%"


class RecentCounts:
    """Counts over the last RECENT_S seconds, from the cumulative ones of each snapshot."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, HitCounts]] = deque()

    def push(self, now: float, counts: HitCounts) -> HitCounts:
        if not self._seen or counts.needed < self._seen[-1][1].needed:  # the first, or counting began again
            self._seen.clear()
            self._seen.append((now, HitCounts()))                       # what came before came since load
        self._seen.append((now, counts))
        while len(self._seen) > 2 and now - self._seen[1][0] >= RECENT_S:
            self._seen.popleft()
        return counts.minus(self._seen[0][1])



class ExpertPanel(Panel):
    title = "Experts"

    def __init__(self) -> None:
        super().__init__([("hit", "Pool hits, since load"), ("recent", "Pool hits, last 2 s"),
                          ("prefetch", "Staging hits, since load"), ("misses", "Misses, since load"),
                          ("slots", "Pool slots"), ("gpu_prefetch", "GPU prefetch"), ("cold", "Cold experts"),
                          ("policy", "Eviction")])
        self._cold_before: Any = None      # the expert stats at the last push (the CPU's busy share since)
        self.rate = Ring(2)     # pool, pool + staging hits in % over the last 2 s
        self.recent = RecentCounts()
        self._layers: np.ndarray = np.zeros(0)
        self._num_layers = 0
        self._heat: np.ndarray = np.zeros((0, 0))
        self._shown_shape: tuple | None = None
        p1 = make_plot(self.graphics, "Experts found in the pool, last 2 s", "%", 0, short="Pool hits, last 2 s")
        p1.setYRange(0, 100, padding=0.02)
        self._rate = curve(p1, "green", "pool hits", short="pool")
        self._rate_all = curve(p1, "cyan", "pool + staging hits", width=1.0, dash=True, short="all hits")
        p2 = self.graphics.addPlot(row=1, col=0, enableMenu=False)
        set_title(p2, "Hits per MoE layer, since load", short="Hits per layer")
        p2.setLabel("left", "%")
        p2.setLabel("bottom", "layer")
        p2.setYRange(0, 100, padding=0.02)
        p2.setMouseEnabled(x=False, y=False)
        p2.hideButtons()
        p2.disableAutoRange()
        self._bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=COLORS["blue"])
        p2.addItem(self._bars)
        p3 = self.graphics.addPlot(row=2, col=0, enableMenu=False)
        set_title(p3, "Routed tokens per expert (row = layer)", short="Tokens per expert")
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
        counts, recent = HitCounts.of(e), self.recent.push(now, HitCounts.of(e))
        self.rate.append(now, recent.share(recent.pool), recent.share(recent.pool + recent.staging))
        self._set_hit_readouts(e, counts, recent)
        r = self.readouts
        r["slots"].set(f"{e.pool_slots_used}/{e.pool_slots_total}" if e.pool_slots_total else NONE_YET)
        r["gpu_prefetch"].set(*claim_summary(e))
        r["cold"].set(*cold_summary(e, self._cold_before))
        self._cold_before = e
        name, _, memory = e.policy.partition(" ")          # "adaptive 0.99": the memory it uses now
        caption = f"Eviction ({memory})" if memory else "Eviction"
        if r["policy"].caption.text() != caption:
            r["policy"].caption.setText(caption)
        r["policy"].set(name or "—", POLICY_TIPS.get(name, "Every expert stays on the GPU"))
        # before the first routed token the engine's per-layer rates are placeholders (1.0): no bars, same axis
        self._num_layers = len(e.per_layer_hit_rate)
        self._layers = np.asarray(e.per_layer_hit_rate if counts.needed else (), dtype=float) * 100.0
        if e.activations:
            self._heat = np.asarray(e.activations, dtype=float)
        self.dirty = True

    def _set_hit_readouts(self, e: Any, counts: HitCounts, recent: HitCounts) -> None:
        r = self.readouts
        counted = (f"Of {counts.needed} experts the layers needed since the model loaded: {counts.pool} were in the "
                   f"pool, {counts.staging} in a staging slot a prefetch filled in time, {counts.misses} missing")
        if not counts.needed:
            counted = ("Nothing counted yet: no token has been routed since the model loaded" if e.policy else
                       "Every expert is on the GPU: nothing can miss, so nothing is counted")
        r["hit"].set(pct(counts.share(counts.pool)), counted)
        r["recent"].set(pct(recent.share(recent.pool)),
                        f"In the last {RECENT_S:.0f} s: {recent.pool} pool hits, {recent.staging} staging hits, "
                        f"{recent.misses} misses" if recent.needed else f"No expert needed in the last {RECENT_S:.0f} s")
        r["prefetch"].set(pct(counts.share(counts.staging)), f"{counts.staging} needed experts a prefetch copied in "
                          f"time; {e.prefetch_wasted} prefetched and never used")
        r["misses"].set(str(counts.misses) if counts.needed else NONE_YET,
                        f"{e.misses_predicted} of them named by a prediction for their layer "
                        "(the most that prefetching could have hidden)")

    def _render(self, now: float) -> None:
        set_series(self._rate, self.rate.view(), 0, now)
        set_series(self._rate_all, self.rate.view(), 1, now)
        self._bars.setOpts(x=np.arange(len(self._layers)), height=self._layers, width=0.7)
        n = self._num_layers
        if self._shown_shape != (n, self._heat.shape):     # fixed ranges: no auto-range pass per redraw
            self._shown_shape = (n, self._heat.shape)
            self.plots[1].setXRange(-0.5, max(n, 1) - 0.5, padding=0.02)
            rows, cols = self._heat.shape if self._heat.size else (1, 1)
            # cell (layer l, expert e) is centred on (e, l), as the bars above centre layer l on l
            self.plots[2].setRange(xRange=(-0.5, cols - 0.5), yRange=(-0.5, rows - 0.5), padding=0)
        if self._heat.size:
            # normalise each layer so a quiet layer's favourite experts still stand out
            peak = self._heat.max(axis=1, keepdims=True)
            self._image.setImage(self._heat / np.where(peak > 0, peak, 1.0), levels=(0.0, 1.0), autoLevels=False)
            rows, cols = self._heat.shape
            self._image.setRect(QRectF(-0.5, -0.5, cols, rows))


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
    predicting = getattr(e, "predicting", ())
    if predicting:
        per = "; ".join(f"{'predicting' if on else 'without predictions'} at {t} token{'s' * (t != 1)}"
                        for t, on in predicting)
        lines.append(f"Replayed steps measured faster: {per}")
    return text, "\n".join(lines)


def cold_summary(e: Any, before: Any = None) -> tuple[str, str]:
    """Where the last step's missing experts ran (host CPU or bus), as a readout: text and tooltip;
    ``before``: the stats of the last update, for the CPU's busy share since."""
    if not e.cold_mode:
        return "—", "Every expert is on the GPU: none is missing, so none runs on the CPU or crosses the bus"
    cpu, bus = e.last_step_experts
    text = f"CPU {cpu} · bus {bus}" if e.cpu_experts or e.bus_experts else "none missed yet"
    modes = {"auto": "the host CPU takes the share of missing experts that measures fastest",
             "bus": "every missing expert crosses the bus", "cpu": "the host CPU computes every missing expert"}
    mode = e.cold_mode.split()[0]
    setting = f"Setting: {mode}: {modes.get(mode, mode)}"
    if "CPU device" in e.cold_mode:       # a CPU run: missing experts are copied within host memory
        return ("none missed yet" if not (e.cpu_experts or e.bus_experts) else f"{cpu + bus} per step",
                f"Last step: {cpu + bus} missing experts copied from the host store\nThe model runs on the CPU: a "
                "missing expert is copied within host memory; there is no GPU and no bus")
    lines = [setting,
             f"Last step: {cpu} missing experts computed on the CPU, {bus} brought over the bus",
             f"Since load: {e.cpu_experts} on the CPU, {e.bus_experts} over the bus"]
    if before is not None and e.steps_ms > before.steps_ms:
        busy = (e.cpu_ms - before.cpu_ms) / (e.steps_ms - before.steps_ms)
        lines.append(f"CPU busy {100 * busy:.0f}% of the step time since the last update")
    shares = getattr(e, "cpu_shares", ())
    if shares:
        per = ", ".join(f"{round(8 * share)}/8 at {t} token{'s' * (t != 1)}" for t, share in shares)
        lines.append(f"Replayed steps: the CPU takes {per} of each layer's missing experts, the most used first")
    if e.cold_measured_ms:
        lines.append(f"Layers with a CPU share: the cost model predicted {e.cold_predicted_ms:.0f} ms, "
                     f"they took {e.cold_measured_ms:.0f} ms (CPU kernels {e.cpu_ms:.0f} ms)")
    return text, "\n".join(lines)

