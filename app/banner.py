"""A stack of dismissible one-line banners (info, amber, red), one per source so each can update."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

LEVELS = ("info", "amber", "red")


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
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.clicked.connect(lambda: owner.clear(key))
        lay.addWidget(close)


class BannerArea(QWidget):
    """Banners keyed by source ("engine", "thermal", "model", …); setting a key replaces its text."""

    def __init__(self) -> None:
        super().__init__()
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(6, 4, 6, 0)
        self._lay.setSpacing(4)
        self._banners: dict[str, _Banner] = {}
        self.hide()

    def show_message(self, key: str, text: str, level: str = "info") -> None:
        """Show (or update) the banner ``key``; an empty text removes it."""
        if not text:
            self.clear(key)
            return
        banner = self._banners.get(key)
        if banner is None:
            banner = self._banners[key] = _Banner(self, key)
            self._lay.addWidget(banner)
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

    def clear(self, key: str) -> None:
        banner = self._banners.pop(key, None)
        if banner is not None:
            self._lay.removeWidget(banner)
            banner.deleteLater()
        self.setVisible(bool(self._banners))
