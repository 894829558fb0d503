"""The transcript: a scrolling column of message bubbles, laid out so that a long chat costs the window
little more per new line or message than a short one."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QPushButton, QScrollArea, QVBoxLayout, QWidget

from app.chat_view import MessageBubble, focus_stops, last_stop, tab_after, tab_before

def _tab_before(bubble: QWidget, before: QWidget) -> None:
    """Tab reaches ``bubble``'s buttons just before ``before``'s, as they lie on screen (Qt puts a widget
    made later at the end of the chain, so earlier messages filled in above would come last)."""
    stops, after = focus_stops(bubble), focus_stops(before)
    if stops and after:
        tab_before(after[0], stops)


PAGE_BUBBLES = 16     # bubbles a page of the transcript holds (see ChatView)
COLUMN_SPACING = 10   # between bubbles, and between pages alike


class _Column(QWidget):
    """The transcript's column. Its size hint is its minimum: the scroll area sizes it to the view's width
    and asks its height at that width, and Qt's own hint would lay every bubble out again at a second width
    on each pass (a layout keeps one width's height), so a long chat's every new line or message
    re-measured all the ones above it."""

    def sizeHint(self) -> QSize:
        return self.minimumSizeHint()


class _MeasuredLayout(QVBoxLayout):
    """A column that remembers its height at each width it was asked about until its items change. Qt's
    keeps one width's, and the scroll area asks two on each pass (with and without its scroll bar): every
    page, then every bubble of a long chat, was measured again on each new line or message."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self._heights: dict[int, tuple[int, int]] = {}      # width -> (height, minimum height)

    def _measure(self, width: int) -> tuple[int, int]:
        known = self._heights.get(width)
        if known is None:
            if len(self._heights) > 4:
                self._heights.clear()
            height = super().heightForWidth(width)
            self._heights[width] = (height, height)          # the minimum below asks heightForWidth again
            known = self._heights[width] = (height, super().minimumHeightForWidth(width))
        return known

    def heightForWidth(self, width: int) -> int:
        return self._measure(width)[0]

    def minimumHeightForWidth(self, width: int) -> int:
        return self._measure(width)[1]

    def invalidate(self) -> None:
        self._heights.clear()
        super().invalidate()


class _ColumnLayout(_MeasuredLayout):
    """The column's layout, which lays its pages out at their full height even before the scroll area has
    made the column that tall. Showing a new bubble lays out every layout above it at once, the column's
    in the height it had before the bubble: the pages below were squeezed, laid out again and stretched
    back, each time (a slice of 12 messages put in above 400 resized every bubble 4 times)."""

    def setGeometry(self, rect: QRect) -> None:
        need = self.heightForWidth(rect.width()) if self.hasHeightForWidth() else -1
        if need > rect.height():
            rect = QRect(rect.x(), rect.y(), rect.width(), need)
        super().setGeometry(rect)


def _page() -> QWidget:
    page = QWidget()
    lay = _MeasuredLayout(page)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(COLUMN_SPACING)
    return page


class ChatView(QScrollArea):
    """A scrolling column of bubbles that follows the newest text while the user is at the bottom.

    The bubbles sit in pages of PAGE_BUBBLES, the pages in the column: a layout pass moves and measures
    every item of a layout, so a message put in above 800 others moved 50 pages rather than 800 bubbles,
    and the bubbles of a page that only moved keep their places inside it."""

    earlier_requested = Signal()          # the reader asked for the messages above the earliest shown

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = _Column()
        self.column = _ColumnLayout(inner)
        self.column.setContentsMargins(12, 12, 12, 12)
        self.column.setSpacing(COLUMN_SPACING)
        self.column.addStretch(1)
        # above the bubbles, while a long chat's earliest messages are not on screen
        self.earlier_button = QPushButton("")
        self.earlier_button.setFlat(True)
        self.earlier_button.hide()
        self.earlier_button.clicked.connect(self.earlier_requested)
        self.column.insertWidget(0, self.earlier_button)
        self.setWidget(inner)
        self.bubbles: list[MessageBubble] = []
        self._pages: list[QWidget] = []
        self._follow = True
        # while earlier messages go in above the reader: the message at the top of what they read and its
        # distance below the view's top, held there until they scroll (a distance from the bottom, kept once
        # a batch, drifted by every later change of the column: "Show earlier messages" moved the page)
        self._anchor: tuple[MessageBubble, int] | None = None
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda v: setattr(self, "_follow", v >= bar.maximum() - 24))
        bar.rangeChanged.connect(self._range_changed)
        bar.actionTriggered.connect(self._reader_scrolled)
        self.earlier_button.clicked.connect(lambda: self._hold_place(asked=True))

    def _top(self, bubble: MessageBubble) -> int:
        return bubble.mapTo(self.widget(), QPoint(0, 0)).y()

    def _hold_place(self, asked: bool = False) -> None:
        """Keep the first message on screen where it is while earlier ones go in above it (unless the view
        follows the newest text and the reader did not ask for them)."""
        if self.bubbles and (asked or not self._follow) and self._anchor is None:
            self._follow = False
            first = self.bubbles[0]
            self._anchor = (first, self._top(first) - self.verticalScrollBar().value())

    def _reader_scrolled(self, _action: int) -> None:
        self._anchor = None

    def _range_changed(self, _lo: int, hi: int) -> None:
        anchor = self._anchor
        if anchor is not None and anchor[0] in self.bubbles:
            self.verticalScrollBar().setValue(self._top(anchor[0]) - anchor[1])
            return
        self._anchor = None
        if self._follow:
            # with ``self`` as context the call is dropped if the view is gone by then
            QTimer.singleShot(0, self, self._to_bottom)

    def _to_bottom(self) -> None:
        """Follow the newest text, unless the reader scrolled away meanwhile (a wheel turned while a long
        chat's messages were still being laid out was undone by the scrolls queued before it)."""
        if self._follow:
            self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def _width(self) -> int:
        """A bubble's width: a new bubble or page is given it before it is shown, so that its text is laid
        out once, at that width, rather than at its default size first."""
        margins = self.column.contentsMargins()
        return max(1, self.widget().width() - margins.left() - margins.right())

    def _new_page(self, at: int) -> QWidget:
        """An empty page, ``at`` in the list of pages."""
        page = _page()
        page.resize(self._width(), 1)
        self.column.insertWidget(1 + at, page)          # after the "Show earlier messages" button
        self._pages.insert(at, page)
        return page

    def _spill(self, page: QWidget) -> None:
        """A page one over full (a bubble put in its middle) passes its last bubble to the start of the next
        page, or of a new one after it: pages never grow, so a pass never lays out more than a page."""
        i = self._pages.index(page)
        last = page.layout().itemAt(page.layout().count() - 1).widget()
        after = self._pages[i + 1] if i + 1 < len(self._pages) else None
        if after is None or after.layout().count() >= PAGE_BUBBLES:
            after = self._new_page(i + 1)
        page.layout().removeWidget(last)
        after.layout().insertWidget(0, last)

    def add(self, role: str, text: str = "", streaming: bool = False, stats: str = "",
            before: MessageBubble | None = None, reasoning: str = "") -> MessageBubble:
        """Append a bubble (or put it just above ``before``) and return it."""
        bubble = MessageBubble(role, text, streaming)
        bubble.resize(self._width(), bubble.height())
        bubble.set_reasoning(reasoning)
        if stats:
            bubble.set_stats(stats)
        if before is not None and before in self.bubbles:
            if before is self.bubbles[0]:
                self._hold_place()          # an earlier message above all the others: the reader's place stays
            page = before.parentWidget()
            at = page.layout().indexOf(before)
            if at == 0 and page.layout().count() >= PAGE_BUBBLES:   # a full page: the bubble ends the one above
                i = self._pages.index(page)                          # it, or starts a new one
                above = self._pages[i - 1] if i else None
                if above is not None and above.layout().count() < PAGE_BUBBLES:
                    page, at = above, above.layout().count()
                else:
                    page, at = self._new_page(i), 0
            page.layout().insertWidget(at, bubble)
            if page.layout().count() > PAGE_BUBBLES:
                self._spill(page)
            self.bubbles.insert(self.bubbles.index(before), bubble)
            _tab_before(bubble, before)
        else:
            page = self._pages[-1] if self._pages else None
            if page is None or page.layout().count() >= PAGE_BUBBLES:
                page = self._new_page(len(self._pages))
            page.layout().addWidget(bubble)
            # Tab: after the message above it (or the transcript itself), before the settings and the box below
            above = next((stop for b in reversed(self.bubbles) if (stop := last_stop(b)) is not None), self)
            tab_after(above, focus_stops(bubble))
            self.bubbles.append(bubble)
            self._follow, self._anchor = True, None
        return bubble

    def _drop(self, bubble: MessageBubble) -> None:
        page = bubble.parentWidget()
        page.layout().removeWidget(bubble)
        bubble.deleteLater()
        if page.layout().count() == 0:
            self._pages.remove(page)
            self.column.removeWidget(page)
            page.deleteLater()

    def remove_last(self, count: int = 1) -> None:
        """Drop the newest ``count`` bubbles (regenerate, edit)."""
        for _ in range(min(count, len(self.bubbles))):
            self._drop(self.bubbles.pop())

    def remove(self, bubble: MessageBubble) -> None:
        """Drop one bubble (regenerate and edit remove the last exchange)."""
        if bubble in self.bubbles:
            self.bubbles.remove(bubble)
            self._drop(bubble)

    def clear(self) -> None:
        self.remove_last(len(self.bubbles))
        self.show_earlier_offer(0)

    def show_earlier_offer(self, hidden: int) -> None:
        """Offer the ``hidden`` earliest messages not on screen (0: none are hidden)."""
        self.earlier_button.setText(f"Show earlier messages ({hidden:,} more)")
        self.earlier_button.setVisible(hidden > 0)
