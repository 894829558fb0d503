"""What every live panel shares: ring buffers, once-created curves, readouts and PNG export."""
from __future__ import annotations

import math
import time

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget


HISTORY = 600          # samples kept per series (60 s at 10 Hz)
WINDOW_S = 60.0        # seconds of history shown
EXPORT_SIZE = (900, 700)
COLORS = {"blue": "#4c9aff", "green": "#3fb950", "amber": "#f0a030", "red": "#e5484d",
          "purple": "#b084f5", "cyan": "#39c5cf", "grey": "#8b949e", "pink": "#f778ba"}


class Ring:
    """Fixed-size (time, value...) history; appending never allocates."""

    def __init__(self, columns: int, size: int = HISTORY) -> None:
        self._data = np.full((size, columns + 1), np.nan)
        self._next = 0
        self._count = 0

    def append(self, t: float, *values: float | None) -> None:
        row = self._data[self._next]
        row[0] = t
        row[1:] = [np.nan if v is None else v for v in values]
        self._next = (self._next + 1) % len(self._data)
        self._count = min(self._count + 1, len(self._data))

    def __len__(self) -> int:
        return self._count

    def view(self) -> np.ndarray:
        """The rows in time order, ``[n, 1 + columns]``."""
        if self._count < len(self._data):
            return self._data[:self._count]
        return np.roll(self._data, -self._next, axis=0)

    def last(self, column: int) -> float | None:
        if not self._count:
            return None
        v = self._data[(self._next - 1) % len(self._data), column + 1]
        return None if np.isnan(v) else float(v)


def make_plot(layout: pg.GraphicsLayoutWidget, title: str, unit: str, row: int) -> pg.PlotItem:
    """A time plot (last WINDOW_S seconds) with a titled left axis; created once per panel."""
    plot = layout.addPlot(row=row, col=0)
    plot.setTitle(f"<span style='color:#c9d1d9;font-size:9pt'>{title}</span>")
    plot.setLabel("left", unit)
    plot.setLabel("bottom", "seconds ago" if row == -1 else "")
    # fixed ranges, never auto-range: pyqtgraph's auto-range walks every item's bounds and regenerates the
    # axis ticks on each setData; fit_y moves the Y range only when the data outgrows it
    plot.disableAutoRange()
    plot.setXRange(-WINDOW_S, 0, padding=0)
    plot.setYRange(0, 1, padding=0)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    plot.setMenuEnabled(False)
    plot.getAxis("bottom").setHeight(18)
    plot.addLegend(offset=(-4, 4), labelTextSize="8pt", brush=pg.mkBrush(21, 23, 26, 200))
    return plot


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at or above ``value`` (1 for nothing positive)."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    step = 10.0 ** math.floor(math.log10(value))
    return next(m * step for m in (1, 2, 5, 10) if value <= m * step * (1 + 1e-9))


def fit_y(plot: pg.PlotItem, values: np.ndarray, bottom: float = 0.0) -> None:
    """Show ``bottom`` up to a round number above the largest of ``values`` (NaNs ignored).

    Calls setYRange only when that round number changes, so the axis keeps its cached ticks.
    """
    finite = values[np.isfinite(values)]
    top = nice_ceiling(float(finite.max()) * 1.05 if finite.size else 0.0)
    (lo, hi) = plot.getViewBox().viewRange()[1]
    if lo != bottom or not math.isclose(hi, top):
        plot.setYRange(bottom, top, padding=0)


def curve(plot: pg.PlotItem, color: str, name: str, width: float = 1.6, dash: bool = False) -> pg.PlotDataItem:
    pen = pg.mkPen(COLORS.get(color, color), width=width)
    if dash:
        pen.setStyle(pg.QtCore.Qt.PenStyle.DashLine)
    return plot.plot([], [], pen=pen, name=name, connect="finite")


def set_series(item: pg.PlotDataItem, rows: np.ndarray, column: int, now: float) -> None:
    """Show ring ``rows`` column ``column`` against seconds-before-``now``."""
    if len(rows) == 0:
        item.setData([], [])
        return
    item.setData(rows[:, 0] - now, rows[:, column + 1], connect="finite")


WIDEST_READOUT = "888.8 tok/s"   # the room every readout keeps, whatever it shows now


class Readout(QWidget):
    """A caption over a large value: "GPU temp" / "71 °C"."""

    def __init__(self, caption: str) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 2, 4, 2)
        lay.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setObjectName("readoutLabel")
        self.value = QLabel("—")
        self.value.setObjectName("readout")
        # a value whose width changes must not re-lay out the dock (and with it the whole window) 10 times a
        # second: the readout's width comes from its grid cell, never from its text
        self.value.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.value.ensurePolished()                     # the style sheet's font, not the default one
        self.value.setMinimumWidth(self.value.fontMetrics().horizontalAdvance(WIDEST_READOUT))
        lay.addWidget(self.caption)
        lay.addWidget(self.value)

    def set(self, text: str, tooltip: str = "") -> None:
        """Change the shown text and tooltip (only what differs: each change costs the GUI an event)."""
        if self.value.text() != text:
            self.value.setText(text)
        if self.value.toolTip() != tooltip:
            self.value.setToolTip(tooltip)


class Panel(QWidget):
    """A dock's content: a row of readouts over a stack of plots; subclasses feed and redraw."""

    title = "Panel"

    def __init__(self, readouts: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"panel_{type(self).__name__}")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(4, 4, 4, 4)
        self._layout.setSpacing(2)
        grid = QGridLayout()
        grid.setSpacing(2)
        self.readouts: dict[str, Readout] = {}
        for i, (key, caption) in enumerate(readouts):
            self.readouts[key] = Readout(caption)
            grid.addWidget(self.readouts[key], i // 4, i % 4)
        self._layout.addLayout(grid)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.ci.setContentsMargins(0, 0, 0, 0)
        # repaint only what changed: a full-viewport repaint of every plot per frame stalls the GUI
        self.graphics.setViewportUpdateMode(self.graphics.ViewportUpdateMode.MinimalViewportUpdate)
        self._layout.addWidget(self.graphics, 1)
        self.dirty = False

    def redraw(self, now: float | None = None) -> None:
        """Push the ring buffers into the curves (only when something changed and the panel shows)."""
        if not self.dirty or not self.isVisible():
            return
        self.dirty = False
        self._render(time.perf_counter() if now is None else now)

    def _render(self, now: float) -> None:
        raise TypeError(f"{type(self).__name__} must define _render")

    def export_png(self, path: str) -> None:
        """Save the panel's plots as a PNG (pyqtgraph exporter)."""
        self.dirty = True
        self._render(time.perf_counter())
        if not self.isVisible():   # a panel in a hidden tab has no useful size: lay it out at a readable one
            self.graphics.ci.resize(*EXPORT_SIZE)
        exporter = pyqtgraph.exporters.ImageExporter(self.graphics.ci)
        exporter.export(path)
