"""What every live panel shares: ring buffers, once-created curves, readouts and PNG export."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtCore import QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.panels.legend import FittedLegend
from app.panels.plot_title import set_title

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


SECONDS_AGO = "seconds ago"
PLOT_MIN_SIZE = (160, 110)     # what a panel's plots need at least: docks may shrink to a laptop's screen


class SecondsAgoAxis(pg.AxisItem):
    """The time axis: samples sit at (t - now) <= 0 and the ticks read how long ago, "60 … 0"."""

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [s.removeprefix("-") for s in super().tickStrings(values, scale, spacing)]


def make_plot(layout: pg.GraphicsLayoutWidget, title: str, unit: str, row: int, short: str = "",
              legend_columns: int = 1) -> pg.PlotItem:
    """A time plot (last WINDOW_S seconds, x axis in seconds ago) with a titled left axis and a legend of
    ``legend_columns`` entries to a row; created once. ``short`` is the title where the plot is too narrow
    for ``title`` (a narrow dock)."""
    # no context menus, from the start: a view box's menu taken away later (setMenuEnabled(False)) is a
    # QMenu deleted with children the binding still wraps, which could crash a later plot's construction
    plot = layout.addPlot(row=row, col=0, axisItems={"bottom": SecondsAgoAxis("bottom")}, enableMenu=False)
    set_title(plot, title, short)
    plot.setLabel("left", unit)
    plot.getAxis("left").enableAutoSIPrefix(False)     # "GB/s (x0.001)" reads worse than 0.06 GB/s
    plot.setLabel("bottom", SECONDS_AGO, **{"font-size": "8pt"})
    # fixed ranges, never auto-range: pyqtgraph's auto-range walks every item's bounds and regenerates the
    # axis ticks on each setData; fit_y moves the Y range only when the data outgrows it
    plot.disableAutoRange()
    plot.setXRange(-WINDOW_S, 0, padding=0)
    plot.setYRange(0, 1, padding=0)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    plot.getAxis("bottom").setHeight(30)
    FittedLegend(plot, legend_columns)
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


def curve(plot: pg.PlotItem, color: str, name: str, width: float = 1.6, dash: bool = False,
          short: str = "") -> pg.PlotDataItem:
    """A line of a plot from make_plot, in its legend as ``name`` (``short`` where the plot is too narrow)."""
    pen = pg.mkPen(COLORS.get(color, color), width=width)
    if dash:
        pen.setStyle(pg.QtCore.Qt.PenStyle.DashLine)
    item = plot.plot([], [], pen=pen, connect="finite")
    plot.legend.addItem(item, name, short)
    return item


def set_series(item: pg.PlotDataItem, rows: np.ndarray, column: int, now: float) -> None:
    """Show ring ``rows`` column ``column`` against seconds-before-``now``."""
    if len(rows) == 0:
        item.setData([], [])
        return
    item.setData(rows[:, 0] - now, rows[:, column + 1], connect="finite")


NOT_SUPPORTED = "n/a"       # a reading the card or its driver does not give (short: it fits the narrowest dock)
NOT_SUPPORTED_TIP = "This GPU or its driver does not report this reading"
WIDEST_READOUT = "888.8 tok/s"   # the room every readout keeps, whatever it shows now
READOUT_COLUMNS = (2, 4)         # fewest and most readouts side by side: a narrow dock stacks them


class ElidedLabel(QLabel):
    """A one-line label cut with "…" to the width it is given, never wider: ``text()`` stays the whole
    text, only the painting is cut, so a long value never widens its dock (and with it the window)."""

    def __init__(self, text: str = "", elide: Qt.TextElideMode = Qt.TextElideMode.ElideRight) -> None:
        super().__init__(text)
        self.elide = elide                  # where the "…" goes (the end, or the middle of a path)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

    def shown_text(self) -> str:
        """What fits on screen now."""
        return self.fontMetrics().elidedText(self.text(), self.elide, self.contentsRect().width())

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        self.style().drawItemText(painter, self.contentsRect(), int(self.alignment()), self.palette(),
                                  self.isEnabled(), self.shown_text(), self.foregroundRole())


class CaptionLabel(ElidedLabel):
    """An ElidedLabel whose tooltip is its whole text while it is cut, over its ``note`` (what the label
    means) if it has one; while it shows whole, the tooltip is the note alone (or none)."""

    def __init__(self, text: str = "") -> None:
        super().__init__(text)
        self.note = ""

    def set_note(self, note: str) -> None:
        """What the label means, in its tooltip whether it is cut or not."""
        self.note = note
        self._fit_tooltip()

    def setText(self, text: str) -> None:
        super().setText(text)
        self._fit_tooltip()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_tooltip()

    def _fit_tooltip(self) -> None:
        cut = self.shown_text() != self.text()
        tip = "\n".join(part for part in (self.text() if cut else "", self.note) if part)
        if tip != self.toolTip():
            self.setToolTip(tip)


class Readout(QWidget):
    """A caption over a large value: "GPU temp" / "71 °C". Its least width is the value's: in a narrow
    dock a long caption ("Staging hits, since load") is cut with "…", whole in its tooltip."""

    def __init__(self, caption: str) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 2, 4, 2)
        lay.setSpacing(0)
        self.caption = CaptionLabel(caption)
        self.caption.setObjectName("readoutLabel")
        self.value = ElidedLabel("—")
        self.value.setObjectName("readout")
        # a value whose width changes must not re-lay out the dock (and with it the whole window) 10 times a
        # second: the readout's width comes from its grid cell, never from its text, which is cut to it
        self.value.ensurePolished()                     # the style sheet's font, not the default one
        self.value.setMinimumWidth(self.value.fontMetrics().horizontalAdvance(WIDEST_READOUT))
        lay.addWidget(self.caption)
        lay.addWidget(self.value)

    def natural_width(self) -> int:
        """The width that shows the caption whole (and the widest value)."""
        self.caption.ensurePolished()
        m = self.layout().contentsMargins()
        return max(self.caption.sizeHint().width(), self.value.minimumWidth()) + m.left() + m.right()

    def set(self, text: str, tooltip: str = "") -> None:
        """Change the shown text and tooltip (only what differs: each change costs the GUI an event).
        A value cut to its cell has its whole text at the head of its tooltip."""
        if self.value.text() != text:
            self.value.setText(text)
        if self.value.shown_text() != text:                  # cut to its cell: the whole value first
            tooltip = f"{text}\n{tooltip}" if tooltip else text
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
        self._grid = QGridLayout()
        self._grid.setSpacing(2)
        self.readouts: dict[str, Readout] = {key: Readout(caption) for key, caption in readouts}
        self._columns = 0
        self._place_readouts(READOUT_COLUMNS[1])
        self._layout.addLayout(self._grid)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.ci.setContentsMargins(0, 0, 0, 0)
        self.graphics.setMinimumSize(*PLOT_MIN_SIZE)
        # the plots take no keys: Tab passes them by (behind another dock's tab it would land out of sight)
        self.graphics.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        # repaint only what changed: a full-viewport repaint of every plot per frame stalls the GUI
        self.graphics.setViewportUpdateMode(self.graphics.ViewportUpdateMode.MinimalViewportUpdate)
        self._layout.addWidget(self.graphics, 1)
        self.dirty = False

    def _place_readouts(self, columns: int) -> None:
        """Lay the readouts out ``columns`` to a row (only when that number changes)."""
        if columns == self._columns:
            return
        self._columns = columns
        for i, readout in enumerate(self.readouts.values()):
            self._grid.addWidget(readout, i // columns, i % columns)      # moves it if placed before
        for c in range(READOUT_COLUMNS[1]):
            self._grid.setColumnStretch(c, 1 if c < columns else 0)

    def readout_columns(self) -> int:
        return self._columns

    def _cell_and_margins(self, least: bool = False) -> tuple[int, int]:
        """(width of one readout column that shows every caption whole, or with ``least`` the narrowest
        one, which cuts them; the panel's side margins together)."""
        m = self._layout.contentsMargins()
        widths = [r.minimumSizeHint().width() if least else r.natural_width() for r in self.readouts.values()]
        return max(max(widths) + self._grid.spacing(), 1), m.left() + m.right()

    def _rows_height(self, columns: int) -> int:
        """The height of the readouts laid out ``columns`` to a row."""
        rows = -(-len(self.readouts) // columns)
        row = max(r.minimumSizeHint().height() for r in self.readouts.values())
        return rows * row + (rows - 1) * self._grid.verticalSpacing()

    def minimumSizeHint(self) -> QSize:
        """As narrow as the fewest readout columns allow (they reflow on resize), whatever they hold now, and
        as tall as the panel is at that width: a window laid out before its panels had their widths (a saved
        layout being restored) keeps room for the rows the readouts stack into."""
        hint = super().minimumSizeHint()
        cell, margins = self._cell_and_margins(least=True)
        narrow = max(READOUT_COLUMNS[0] * cell, PLOT_MIN_SIZE[0]) + margins
        stacked = self._rows_height(READOUT_COLUMNS[0]) - self._rows_height(self._columns)
        return QSize(min(hint.width(), narrow), hint.height() + stacked)

    def resizeEvent(self, event: QResizeEvent) -> None:
        # as many columns as show the captions whole (so a panel looks the same wherever they fit)
        cell, margins = self._cell_and_margins()
        fits = (event.size().width() - margins) // cell
        self._place_readouts(max(READOUT_COLUMNS[0], min(READOUT_COLUMNS[1], fits)))
        super().resizeEvent(event)

    def on_screen(self) -> bool:
        """Whether any of the panel shows: Qt counts a dock behind another's tab as visible (it moves it out
        of the window), and a minimized window's panels too."""
        top = self.window()
        if not self.isVisible() or top.isMinimized():
            return False
        return top.rect().intersects(QRect(self.mapTo(top, QPoint(0, 0)), self.size()))

    def redraw(self, now: float | None = None) -> None:
        """Push the ring buffers into the curves (only when something changed and the panel shows)."""
        if not self.dirty or not self.on_screen():
            return
        self.dirty = False
        self._render(time.perf_counter() if now is None else now)

    def _render(self, now: float) -> None:
        raise TypeError(f"{type(self).__name__} must define _render")

    def export_png(self, path: str) -> None:
        """Save the panel's plots as a PNG (pyqtgraph exporter)."""
        self.dirty = True
        self._render(time.perf_counter())
        ci = self.graphics.ci
        shown = ci.geometry()
        # a panel in a background tab (or a dock squeezed small) has no readable size: lay its plots out
        # at EXPORT_SIZE for the picture, then give them back the size they have on screen
        small = shown.width() < EXPORT_SIZE[0] or shown.height() < EXPORT_SIZE[1]
        if small:
            ci.setGeometry(QRectF(0, 0, max(shown.width(), EXPORT_SIZE[0]), max(shown.height(), EXPORT_SIZE[1])))
        try:
            image = pyqtgraph.exporters.ImageExporter(ci).export(toBytes=True)
        finally:
            if small:
                ci.setGeometry(shown)
        if image is None or not image.save(path, "PNG"):    # Qt reports a failed write only so
            folder = Path(path).parent
            why = "the folder does not exist" if not folder.is_dir() else "it cannot be written there"
            raise OSError(f"{why}")
