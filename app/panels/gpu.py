"""GPU thermal and power: temperatures against the slowdown limit, power against its cap, clocks,
and clock-event (throttle) reasons as flags with a timeline. Colours itself amber or red.

With a pipeline over several cards, a table above the readouts has one row per card (``app.panels.cards``).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QStackedWidget, QVBoxLayout, QWidget

from app.gpu_poller import CardReadings
from app.panels.base import (COLORS, NOT_SUPPORTED, NOT_SUPPORTED_TIP, Panel, Ring, curve, fit_y, make_plot,
                              set_series)
from app.panels.cards import CardsTable
from app.thermal import AMBER, OK, RED, UNKNOWN, ThermalState

#: Timeline rows, top to bottom.
TIMELINE_REASONS = ("hardware thermal slowdown", "software thermal slowdown", "hardware slowdown",
                    "hardware power brake", "software power cap")
_STATE_WORDS = {OK: "Normal", AMBER: "Warning", RED: "Throttling", UNKNOWN: "No GPU"}


def reading(value: float | None, unit: str, digits: int = 0) -> tuple[str, str]:
    """"71 °C", or "n/a" with a tooltip saying the card does not report it — never a made-up 0; (text,
    tooltip) as ``Readout.set`` takes them."""
    return (NOT_SUPPORTED, NOT_SUPPORTED_TIP) if value is None else (f"{value:.{digits}f} {unit}", "")


class GpuPanel(Panel):
    title = "GPU thermal and power"

    def __init__(self) -> None:
        super().__init__([("state", "State"), ("temp", "GPU temp"), ("memtemp", "Memory temp"),
                          ("power", "Power / limit"), ("sm", "SM clock"), ("memclk", "Memory clock"),
                          ("util", "GPU util"), ("fan", "Fan")])
        self.state = ThermalState(UNKNOWN)
        self.status_text = ""
        self.temps = Ring(2, 300)      # gpu, memory °C (1 Hz: 5 minutes)
        self.power = Ring(2, 300)      # W, limit W
        self.clocks = Ring(2, 300)     # SM, memory MHz
        self.flags = Ring(len(TIMELINE_REASONS), 300)
        self._build_plots()
        self._build_no_gpu_page()
        self.flags_label = QLabel("Throttle reasons: —")
        self.flags_label.setWordWrap(True)
        self._layout.insertWidget(1, self.flags_label)
        self.cards = CardsTable()          # hidden until the engine reports a pipeline's stages
        self._layout.insertWidget(0, self.cards)

    def _build_plots(self) -> None:
        g = self.graphics
        pt = make_plot(g, "Temperature", "°C", 0)
        self._gpu_t = curve(pt, "amber", "GPU")
        self._mem_t = curve(pt, "pink", "memory")
        self._slowdown = pg.InfiniteLine(angle=0, pen=pg.mkPen(COLORS["red"], width=1, style=Qt.PenStyle.DashLine),
                                         label="slowdown {value:.0f} °C",
                                         # under the line, right of the middle: clear of the legend at the top
                                         # left and of the plot's top edge
                                         labelOpts={"color": COLORS["red"], "position": 0.62,
                                                    "anchors": [(0.5, 0), (0.5, 0)]})
        self._slowdown.setVisible(False)
        pt.addItem(self._slowdown)
        pp = make_plot(g, "Power", "W", 1)
        self._power = curve(pp, "blue", "draw")
        self._limit = curve(pp, "red", "limit", width=1.2, dash=True)
        pc = make_plot(g, "Clocks", "MHz", 2)
        self._sm = curve(pc, "green", "SM")
        self._memclk = curve(pc, "purple", "memory")
        pf = make_plot(g, "Throttle timeline", "", 3)
        pf.setYRange(-0.5, len(TIMELINE_REASONS) - 0.5, padding=0)
        pf.getAxis("left").setTicks([[(len(TIMELINE_REASONS) - 1 - i, r.replace("software", "SW")
                                       .replace("hardware", "HW")) for i, r in enumerate(TIMELINE_REASONS)]])
        pf.legend.setVisible(False)
        self._flag_curves = [pf.plot([], [], pen=pg.mkPen(COLORS["red" if "hardware" in r else "amber"], width=6),
                                     connect="finite") for r in TIMELINE_REASONS]
        self.plots = (pt, pp, pc, pf)

    def _build_no_gpu_page(self) -> None:
        self.stack = QStackedWidget()
        idx = self._layout.indexOf(self.graphics)
        self._layout.removeWidget(self.graphics)
        self.no_gpu = QLabel("No NVIDIA GPU detected")
        self.no_gpu.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.no_gpu.setWordWrap(True)
        self.no_gpu.setStyleSheet("font-size: 13pt; color: #9aa3ad;")
        page = QWidget()
        QVBoxLayout(page).addWidget(self.no_gpu)
        self.stack.addWidget(page)
        self.stack.addWidget(self.graphics)
        self._layout.insertWidget(idx, self.stack, 1)

    def push_stats(self, s: Any, now: float | None = None) -> None:
        """One EngineStats snapshot: the per-card rows of a pipeline (the plots are NVML's alone)."""
        self.cards.push_stats(s, time.perf_counter() if now is None else now)

    def push_cards(self, readings: CardReadings) -> None:
        """One poll of the pipeline's cards: their temperatures and throttle reasons in their rows."""
        self.cards.push_cards(readings)

    def push_gpu(self, s: Any, state: ThermalState, now: float | None = None) -> None:
        """One GpuSample and the thermal state assessed from it."""
        now = time.perf_counter() if now is None else now
        self.state = state
        self.status_text = s.status
        self.stack.setCurrentIndex(1 if s.available else 0)
        for key, readout in self.readouts.items():
            readout.setVisible(s.available or key == "state")
        self.flags_label.setVisible(s.available)
        if not s.available:
            self.no_gpu.setText(f"{s.status or 'No NVIDIA GPU detected'}\n\nThe engine runs on the CPU; "
                                "GPU temperature, power and clocks appear here on a machine with an NVIDIA card.")
        self.temps.append(now, s.gpu_temp_c, s.mem_temp_c)
        self.power.append(now, s.power_w, s.power_limit_w)
        self.clocks.append(now, s.sm_clock_mhz, s.mem_clock_mhz)
        active = set(s.throttle_reasons or ())
        self.flags.append(now, *[len(TIMELINE_REASONS) - 1 - i if r in active else None
                                 for i, r in enumerate(TIMELINE_REASONS)])
        self._set_readouts(s, state)
        border = {AMBER: COLORS["amber"], RED: COLORS["red"]}.get(state.level)
        sheet = f"#panel_GpuPanel {{ border: 2px solid {border}; border-radius: 4px; }}" if border else ""
        if self.styleSheet() != sheet:     # a new sheet re-polishes every child: only on a change of level
            self.setStyleSheet(sheet)
        # shown first: a hidden line's label keeps the text it had ("slowdown 0 °C") when its value changes
        self._slowdown.setVisible(s.slowdown_temp_c is not None)
        if s.slowdown_temp_c is not None and self._slowdown.value() != s.slowdown_temp_c:
            self._slowdown.setValue(s.slowdown_temp_c)
        self.dirty = True

    def _set_readouts(self, s: Any, state: ThermalState) -> None:
        r = self.readouts
        r["state"].set(_STATE_WORDS[state.level], "\n".join(state.reasons))
        value = r["state"].value
        if value.objectName() != f"state_{state.level}":
            value.setObjectName(f"state_{state.level}")
            value.style().unpolish(value)
            value.style().polish(value)
        if not s.available:
            for key in ("temp", "memtemp", "power", "sm", "memclk", "util", "fan"):
                r[key].set("no GPU")
            self.flags_label.setText("Throttle reasons: no GPU")
            return
        limit = f" / {s.slowdown_temp_c:.0f}" if s.slowdown_temp_c is not None and s.gpu_temp_c is not None else ""
        r["temp"].set(*((NOT_SUPPORTED, NOT_SUPPORTED_TIP) if s.gpu_temp_c is None else
                        (f"{s.gpu_temp_c:.0f}{limit} °C", "")))
        r["memtemp"].set(*reading(s.mem_temp_c, "°C"))
        if s.power_w is None:
            r["power"].set(NOT_SUPPORTED, NOT_SUPPORTED_TIP)
        else:
            r["power"].set(f"{s.power_w:.0f} / {s.power_limit_w:.0f} W" if s.power_limit_w else f"{s.power_w:.0f} W")
        r["sm"].set(*reading(s.sm_clock_mhz, "MHz"))
        r["memclk"].set(*reading(s.mem_clock_mhz, "MHz"))
        r["util"].set(*reading(s.gpu_util_pct, "%"))
        r["fan"].set(*reading(s.fan_pct, "%"))
        if s.throttle_reasons is None:
            self.flags_label.setText("Throttle reasons: not reported by this GPU")
        else:
            self.flags_label.setText("Throttle reasons: " + (", ".join(s.throttle_reasons) or "none"))

    def _render(self, now: float) -> None:
        rows = self.temps.view()
        set_series(self._gpu_t, rows, 0, now)
        set_series(self._mem_t, rows, 1, now)
        limit = self._slowdown.value() if self._slowdown.isVisible() else np.nan
        fit_y(self.plots[0], np.append(rows[:, 1:3], limit))
        rows = self.power.view()
        set_series(self._power, rows, 0, now)
        set_series(self._limit, rows, 1, now)
        fit_y(self.plots[1], rows[:, 1:3])
        rows = self.clocks.view()
        set_series(self._sm, rows, 0, now)
        set_series(self._memclk, rows, 1, now)
        fit_y(self.plots[2], rows[:, 1:3])
        rows = self.flags.view()
        for i, item in enumerate(self._flag_curves):
            set_series(item, rows, i, now)
