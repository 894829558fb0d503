"""A stack of dismissible banners (info, amber, red), one per source so each can update.

The stack scrolls: it is as tall as its banners up to MOST_LINES lines of text, and the window counts no
more than LEAST_LINES of it in its least height, so any number of banners (a load's notes, one each) leaves
the chat its room on a small screen. A banner that comes up goes on top, and the stack scrolls back to it.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QToolButton, QVBoxLayout, QWidget

LEVELS = ("info", "amber", "red")
# heights in lines of text, a banner's padding included
LEAST_LINES = 4     # the least height: one banner of three lines whole (or the top of a longer stack)
MOST_LINES = 11     # the most before it scrolls: three banners of two lines, and the top of a fourth
CHAT_ROOM_LINES = 4     # lines the chat below gets, past its own least height, before the banners pass their least


class _Banner(QFrame):
    def __init__(self, owner: "BannerArea", key: str) -> None:
        super().__init__()
        self.setProperty("class", "banner")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 5, 4, 5)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.label, 1)
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Dismiss")
        self.close_button.clicked.connect(lambda: owner.clear(key))
        lay.addWidget(self.close_button)


class BannerArea(QScrollArea):
    """Banners keyed by source ("engine", "thermal", "model", …); setting a key replaces its text."""

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # as tall as its banners up to MOST_LINES (its size hint), down to its least height in a short window
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        stack = QWidget()
        self._lay = QVBoxLayout(stack)
        self._lay.setContentsMargins(6, 4, 6, 0)
        self._lay.setSpacing(4)
        self.setWidget(stack)
        self._banners: dict[str, _Banner] = {}
        self.room: int | None = None     # the most height the window spares it now (None: no bound)
        self.hide()

    def show_message(self, key: str, text: str, level: str = "info") -> None:
        """Show (or update) the banner ``key``; an empty text removes it. A new one goes on top, in view."""
        if not text:
            self.clear(key)
            return
        banner = self._banners.get(key)
        if banner is None:
            banner = self._banners[key] = _Banner(self, key)
            self._lay.insertWidget(0, banner)
            banner.show()
            self.verticalScrollBar().setValue(0)
        if banner.objectName() != f"banner_{level}":
            banner.setObjectName(f"banner_{level}")
            banner.style().unpolish(banner)
            banner.style().polish(banner)
        banner.label.setText(text)
        self.show()

    def text(self, key: str) -> str:
        banner = self._banners.get(key)
        return banner.label.text() if banner is not None else ""

    def level(self, key: str) -> str | None:
        banner = self._banners.get(key)
        return banner.objectName().removeprefix("banner_") if banner is not None else None

    def banner(self, key: str) -> QFrame | None:
        """The banner ``key`` (its label and its close button), if it is up."""
        return self._banners.get(key)

    def clear(self, key: str) -> None:
        banner = self._banners.pop(key, None)
        if banner is not None:
            self._lay.removeWidget(banner)
            banner.deleteLater()
        self.setVisible(bool(self._banners))

    def _content_height(self) -> int:
        """The banners' height at the width the area has now (their lines wrap to it)."""
        width = self.contentsRect().width()
        if self._lay.hasHeightForWidth() and self.testAttribute(Qt.WidgetAttribute.WA_Resized):
            return self._lay.totalHeightForWidth(width)
        return self._lay.totalSizeHint().height()

    def _lines(self, lines: int) -> int:
        return lines * self.fontMetrics().lineSpacing()

    def sizeHint(self) -> QSize:
        most = self._lines(MOST_LINES) if self.room is None else min(self._lines(MOST_LINES), self.room)
        return QSize(super().sizeHint().width(), min(self._content_height(), most))

    def minimumSizeHint(self) -> QSize:
        return QSize(super().minimumSizeHint().width(), min(self._content_height(), self._lines(LEAST_LINES)))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()          # another width: lines wrap anew, so the banners' height changes

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()          # a banner came, went or has a new text: the area's hints change
        return super().eventFilter(watched, event)


class BannerColumn(QWidget):
    """The banners over the chat, the banners giving way first: in a short window they shrink toward their
    least height (and scroll) before the chat below loses any of CHAT_ROOM_LINES lines past its least."""

    def __init__(self, banners: BannerArea, below: QWidget) -> None:
        super().__init__()
        self.banners, self.below = banners, below
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(banners)
        lay.addWidget(below, 1)

    def resizeEvent(self, event: QResizeEvent) -> None:
        room = self.below.minimumSizeHint().height() + CHAT_ROOM_LINES * self.fontMetrics().lineSpacing()
        if self.height() - room != self.banners.room:
            self.banners.room = self.height() - room      # the banners' preferred height stops there
            self.banners.updateGeometry()
        super().resizeEvent(event)
