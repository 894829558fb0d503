"""A plot's title that fits the width its plot has, down to the narrowest dock.

pyqtgraph's own title label asks its plot for the whole title's width at least, so a long title in a narrow
dock made the plot wider than the dock and both were cut at the dock's edge. This one takes any width: where
the whole title does not fit it shows a shorter one, cut with "…" only if even that does not fit, and the
whole title is its tooltip then.
"""
from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetricsF
from PySide6.QtWidgets import QGraphicsSceneResizeEvent

TITLE_COLOR = "#c9d1d9"
TITLE_POINTS = 9
TITLE_HEIGHT = 30        # the row pyqtgraph gives a plot's title


class PlotTitle(pg.LabelItem):
    """The title ``title`` of one plot, or ``short`` where the plot is too narrow for it."""

    def __init__(self, title: str, short: str = "", parent: pg.PlotItem | None = None) -> None:
        self.title, self.short = title, short or title
        self.shown = ""
        super().__init__(" ", parent=parent, size="11pt")        # what pyqtgraph's title label is made with
        self.setMaximumHeight(TITLE_HEIGHT)
        self._show(title)

    def _font(self) -> QFont:
        font = QFont(self.item.font())
        font.setPointSizeF(TITLE_POINTS)
        return font

    def fitting(self, width: float) -> str:
        """The text shown at ``width``: the title, else the short one, else the short one cut with "…"."""
        room = width - 2 * self.item.document().documentMargin()
        metrics = QFontMetricsF(self._font())
        for text in (self.title, self.short):
            if metrics.horizontalAdvance(text) <= room:
                return text
        return metrics.elidedText(self.short, Qt.TextElideMode.ElideRight, max(room, 0.0))

    def _show(self, text: str) -> None:
        if text == self.shown:
            return
        self.shown = text
        self.setText(f"<span style='color:{TITLE_COLOR};font-size:{TITLE_POINTS}pt'>{html.escape(text)}</span>")
        self.setToolTip("" if text == self.title else self.title)

    def updateMin(self) -> None:
        super().updateMin()
        self.setMinimumWidth(0)        # any width: the text is fitted to the one the plot gives

    def resizeEvent(self, ev: QGraphicsSceneResizeEvent | None) -> None:
        if ev is not None:             # (None: pyqtgraph places the text anew after a setText)
            self._show(self.fitting(self.rect().width()))
        super().resizeEvent(ev)


def set_title(plot: pg.PlotItem, title: str, short: str = "") -> PlotTitle:
    """Give ``plot`` a PlotTitle (``short`` where the plot is too narrow for ``title``) in place of
    pyqtgraph's own title label."""
    old = plot.titleLabel
    plot.layout.removeItem(old)
    if old.scene() is not None:
        old.scene().removeItem(old)
    label = PlotTitle(title, short, parent=plot)
    plot.layout.addItem(label, 0, 1)
    plot.layout.setRowFixedHeight(0, TITLE_HEIGHT)
    plot.titleLabel = label
    return label
