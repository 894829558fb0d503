"""Device memory by category (resident, expert pool, KV, workspace) against the budget, KV use, and the
host store of the experts the pool does not hold."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyqtgraph as pg

from app.panels.base import (COLORS, NOT_SUPPORTED, NOT_SUPPORTED_TIP, Panel, Ring, curve, fit_y, make_plot,
                              set_series)

GIB = float(1 << 30)
# name, name in a narrow dock's legend, colour
_CATEGORIES = (("resident", "", "blue"), ("expert pool", "pool", "green"), ("KV cache", "KV", "purple"),
               ("workspace", "work", "amber"))


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    if n >= 1 << 30:
        return f"{n / GIB:.2f} GiB"
    if n >= 100 << 20 or n == 0:
        return f"{n / (1 << 20):.0f} MiB"
    if n >= 1 << 20:                      # as the Expert pool knob shows sizes below 100 MiB: 9.0, 1.8
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.0f} KiB"          # a tiny model's parts: not "0 MiB"


def workspace_readout(workspace: int, budget: int | None) -> tuple[str, str]:
    """The workspace readout: the plan's reserve for activations within the budget, if there is one."""
    if budget is None:
        return "none (CPU)", "Without a GPU budget nothing is set aside for activations: they take what they need"
    return fmt_bytes(workspace), "Kept free in the budget for activations, logits and kernel scratch"


def pool_readout(pool_bytes: int, staging_bytes: int) -> tuple[str, str]:
    """(caption, value): the pool's slots, as the Expert pool knob sizes them, and its staging beside them
    ("Expert pool + staging", "9.0 + 3.0 MiB"; the unit once where both have it), short enough for a
    readout's cell."""
    if not staging_bytes:
        return "Expert pool", fmt_bytes(pool_bytes)
    slots, staging = fmt_bytes(pool_bytes - staging_bytes), fmt_bytes(staging_bytes)
    unit = slots.rsplit(" ", 1)[-1]
    if staging.endswith(" " + unit):
        slots = slots[:-len(unit) - 1]
    return "Expert pool + staging", f"{slots} + {staging}"


def pool_tip(pool_bytes: int, staging_bytes: int) -> str:
    """The expert pool's tooltip: how much of it is staging (the slots misses and prefetches pass through)."""
    if not staging_bytes:
        return "Device slots of routed experts" if pool_bytes else ""
    return (f"{fmt_bytes(pool_bytes - staging_bytes)} of pool slots + {fmt_bytes(staging_bytes)} of staging: one "
            "layer's experts and the prefetches of decode steps pass through it")


def host_readout(host_bytes: int, device: str) -> tuple[str, str, str]:
    """The host store readout (caption, value, tooltip): its size, and whether it is pinned (page-locked),
    which only CUDA does."""
    if not host_bytes:
        return "Host store", "none", "Every expert is resident: there is no host store"
    if device.startswith("cuda"):
        return "Host store (pinned)", fmt_bytes(host_bytes), ("Every routed expert in page-locked host memory, "
                                                              "so misses cross the bus as DMA at full speed")
    return "Host store (unpinned)", fmt_bytes(host_bytes), ("Every routed expert in ordinary host memory: "
                                                            "0 bytes pinned, as pinning needs CUDA")


class MemoryPanel(Panel):
    title = "Memory"

    def __init__(self) -> None:
        super().__init__([("resident", "Resident"), ("pool", "Expert pool"), ("kv", "KV cache"),
                          ("workspace", "Workspace"), ("budget", "Budget"), ("kvuse", "KV blocks used"),
                          ("vram", "VRAM (NVML)"), ("host", "Host store"), ("peak", "Peak allocated")])
        self.mem = Ring(5)       # cumulative stack tops in GiB, budget
        self.kv = Ring(1)        # KV blocks used %
        # five entries two to a row: a short plot keeps them inside it
        p1 = make_plot(self.graphics, "Device memory by category (stacked)", "GiB", 0, short="Memory by category",
                       legend_columns=2)
        self._stack = [curve(p1, color, name, width=1.2, short=short) for name, short, color in _CATEGORIES]
        self._fills = []
        lower = None
        for i, (_, _, color) in enumerate(_CATEGORIES):
            c = pg.mkColor(COLORS[color])
            c.setAlpha(70)
            base = lower if lower is not None else p1.plot([], [], pen=None)
            fill = pg.FillBetweenItem(base, self._stack[i], brush=pg.mkBrush(c))
            p1.addItem(fill)
            self._fills.append(fill)
            lower = self._stack[i]
        self._zero = self._fills[0].curves[0]
        self._budget = curve(p1, "red", "budget", width=1.4, dash=True)
        self._budget_listed = True
        self._unit: tuple[str, float] | None = None   # chosen on the first sample: GiB, or MiB for small models
        p2 = make_plot(self.graphics, "KV cache use", "%", 1)
        p2.setYRange(0, 100, padding=0.02)
        self._kv = curve(p2, "purple", "blocks used")
        self.plots = (p1, p2)

    def push_stats(self, s: Any, now: float | None = None) -> None:
        """One EngineStats snapshot."""
        now = time.perf_counter() if now is None else now
        m = s.memory
        parts = np.cumsum([m.resident_bytes, m.expert_pool_bytes, m.kv_cache_bytes, m.workspace_bytes])
        if self._unit is None:
            self._unit = ("GiB", GIB) if max(parts[-1], m.budget_bytes or 0) >= GIB else ("MiB", float(1 << 20))
            self.plots[0].setLabel("left", self._unit[0])
        if self._budget_listed != (m.budget_bytes is not None):    # no budget (CPU): no line, no entry
            legend = self.plots[0].legend
            legend.addItem(self._budget, "budget") if m.budget_bytes is not None else legend.removeItem(self._budget)
            self._budget_listed = m.budget_bytes is not None
        parts = parts / self._unit[1]
        budget = None if m.budget_bytes is None else m.budget_bytes / self._unit[1]
        self.mem.append(now, *parts, budget)
        kv_pct = 100.0 * s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else None
        self.kv.append(now, kv_pct)
        r = self.readouts
        r["resident"].set(fmt_bytes(m.resident_bytes))
        pool, staging = m.expert_pool_bytes, m.staging_bytes
        caption, value = pool_readout(pool, staging)
        if r["pool"].caption.text() != caption:
            r["pool"].caption.setText(caption)
        r["pool"].set(value, pool_tip(pool, staging))
        tip = f"dtype {s.kv_cache_dtype}" if s.kv_cache_dtype else ""
        if m.kv_window_bytes:
            tip += f"; {fmt_bytes(m.kv_window_bytes)} of it hold the sliding-window layers (a fixed pool)"
        r["kv"].set(fmt_bytes(m.kv_cache_bytes), tip)
        r["workspace"].set(*workspace_readout(m.workspace_bytes, m.budget_bytes))
        r["budget"].set(fmt_bytes(m.budget_bytes) if m.budget_bytes else "none (CPU)")
        r["kvuse"].set("—" if kv_pct is None else f"{s.kv_blocks_used}/{s.kv_blocks_total} ({kv_pct:.0f}%)")
        caption, value, tip = host_readout(m.pinned_host_bytes, s.device)
        if r["host"].caption.text() != caption:
            r["host"].caption.setText(caption)
        if m.host_table_bytes:
            tip += f"; {fmt_bytes(m.host_table_bytes)} of it is the token embedding table, read one row per token"
        r["host"].set(value, tip)
        counted = m.resident_bytes + m.expert_pool_bytes + m.kv_cache_bytes + m.workspace_bytes
        r["peak"].set(fmt_bytes(m.max_allocated_bytes) if m.max_allocated_bytes else "—",
                      f"The most torch has held on the card since load; the plan counts {fmt_bytes(counted)}"
                      if m.max_allocated_bytes and m.budget_bytes else "")
        self.dirty = True

    def push_gpu(self, sample: Any) -> None:
        """NVML's view of the card's memory (all processes)."""
        if sample.vram_used_bytes is None or sample.vram_total_bytes is None:
            self.readouts["vram"].set(*((NOT_SUPPORTED, NOT_SUPPORTED_TIP) if sample.available else ("no GPU", "")))
        else:
            self.readouts["vram"].set(f"{sample.vram_used_bytes / GIB:.1f}/{sample.vram_total_bytes / GIB:.0f} GiB")

    def _render(self, now: float) -> None:
        rows = self.mem.view()
        for i, item in enumerate(self._stack):
            set_series(item, rows, i, now)
        if len(rows):
            self._zero.setData(rows[:, 0] - now, np.zeros(len(rows)))
        set_series(self._budget, rows, 4, now)
        fit_y(self.plots[0], rows[:, 4:6])     # the top of the stack and the budget
        set_series(self._kv, self.kv.view(), 0, now)
