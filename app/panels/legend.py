"""A plot's legend that fits the room its plot has, down to the narrowest dock.

pyqtgraph's legend keeps the columns and names it was given, so in a narrow dock or a short plot its entries
ran past the plot's edge and were cut there. This one is laid out as it was given wherever that fits; where it
does not, it takes more columns (fewer rows), then tighter margins, then each entry's short name (the whole
name in that entry's tooltip), whichever fits first, or else whichever leaves the least outside the plot.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import pyqtgraph as pg
from PySide6.QtCore import QSizeF, Qt

OFFSET = (10, 4)                 # the legend's top left corner from the plot's
COMPACT_MARGINS = (4, 2, 4, 2)   # left, top, right, bottom: in a plot too small for the usual ones
TEXT_SIZE = "8pt"
BACKGROUND = (21, 23, 26, 200)


@dataclass(frozen=True)
class LegendPlan:
    """How the legend is laid out now."""

    short: bool                                   # each entry's short name, not its whole one
    columns: int                                  # entries side by side (they fill a row, then the next)
    margins: tuple[float, float, float, float]    # inside the frame: left, top, right, bottom
    size: QSizeF                                  # the legend's size laid out so


def overflow(size: QSizeF, room: QSizeF) -> float:
    """How far a legend of ``size`` reaches past ``room``, across and down together (0: it fits)."""
    return max(size.width() - room.width(), 0.0) + max(size.height() - room.height(), 0.0)


class FittedLegend(pg.LegendItem):
    """The legend of ``plot``, ``columns`` entries to a row where they fit; ``addItem(item, name, short)``
    gives an entry a short name for a plot too narrow for the whole one."""

    def __init__(self, plot: pg.PlotItem, columns: int = 1) -> None:
        super().__init__(offset=OFFSET, labelTextSize=TEXT_SIZE, brush=pg.mkBrush(*BACKGROUND), colCount=columns)
        self.columns = columns
        self.margins = self.layout.getContentsMargins()
        self._names: dict[object, tuple[str, str]] = {}      # plotted item: whole name, short name
        self._text_sizes: dict[str, QSizeF] = {}
        self.plan: LegendPlan | None = None
        self._applying = False
        self.setParentItem(plot.vb)
        plot.legend = self                # where pyqtgraph's PlotItem.addLegend keeps its legend
        plot.vb.sigResized.connect(self.fit)

    def addItem(self, item: object, name: str, short: str = "") -> None:
        self._names[item] = (name, short or name)
        super().addItem(item, name)

    def removeItem(self, item: object) -> None:
        self._names.pop(item, None)
        super().removeItem(item)

    def updateSize(self) -> None:
        # pyqtgraph sizes its legend so after each change of entries: here it is laid out anew (a new entry
        # comes with its whole name, whatever the others show)
        if not self._applying:
            self.plan = None
            self.fit()

    def names(self) -> list[tuple[str, str]]:
        """(whole, short) name of each entry, in order."""
        return [self._names.get(sample.item, (label.text, label.text)) for sample, label in self.items]

    def fit(self, *_view: object) -> None:
        """Lay the entries out for the room the plot has now."""
        room = self.parentItem().rect().size() - QSizeF(*OFFSET)
        plan = self._plan(room)
        if plan != self.plan:
            self._apply(plan)

    def _plan(self, room: QSizeF) -> LegendPlan:
        n = max(len(self.items), 1)
        preferred = min(self.columns, n)
        columns = range(preferred, n + 1)         # more entries to a row, never fewer: a legend kept low
        short = [False, True] if any(whole != short for whole, short in self.names()) else [False]
        plans = [self._laid_out(s, c, margins) for s, margins, c in
                 product(short, (self.margins, COMPACT_MARGINS), columns)]
        return min(plans, key=lambda plan: overflow(plan.size, room))     # the first of those that fit

    def _laid_out(self, short: bool, columns: int, margins: tuple[float, float, float, float]) -> LegendPlan:
        """The size of the legend laid out so (as its grid lays it out: a sample and its name a column each)."""
        texts = [shortened if short else whole for whole, shortened in self.names()]
        sample = QSizeF(20, 20) if not self.items else self.items[0][0].effectiveSizeHint(Qt.SizeHint.PreferredSize)
        across, down = self.layout.horizontalSpacing(), self.layout.verticalSpacing()
        widths = [max((self._text_size(t).width() for t in texts[c::columns]), default=0.0) for c in range(columns)]
        rows = -(-len(texts) // columns)
        heights = [max([sample.height()] + [self._text_size(t).height() for t in texts[r * columns:(r + 1) * columns]])
                   for r in range(rows)]
        width = sum(sample.width() + across + w for w in widths) + across * (columns - 1) + margins[0] + margins[2]
        height = sum(heights) + down * max(rows - 1, 0) + margins[1] + margins[3]
        return LegendPlan(short, columns, margins, QSizeF(width, height))

    def _text_size(self, text: str) -> QSizeF:
        if text not in self._text_sizes:
            label = pg.LabelItem(text, justify="left", size=self.opts["labelTextSize"])
            self._text_sizes[text] = label.effectiveSizeHint(Qt.SizeHint.PreferredSize)
        return self._text_sizes[text]

    def _apply(self, plan: LegendPlan) -> None:
        self.plan = plan
        self.layout.setContentsMargins(*plan.margins)
        for (sample, label), (whole, shortened) in zip(self.items, self.names()):
            text = shortened if plan.short else whole
            if label.text != text:
                label.setText(text)
            tip = "" if text == whole else whole               # a short name: the whole one on hover
            label.setToolTip(tip)
            sample.setToolTip(tip)
        self._applying = True
        try:
            self.setColumnCount(plan.columns)
        finally:
            self._applying = False
        self.resize(plan.size)
