"""The window's status bar: what runs (left), the local server, the engine's speeds and the GPU (right).

Two labels that a plain QLabel and QStatusBar's own messages get wrong:

- ``MessageSlot`` (left, takes the room left over): the model and its state, and for a few seconds at a
  time a message ("Saved chat.md"). QStatusBar's own ``showMessage`` is cleared whenever a widget on the
  right shows or hides (the server turning on), so a message lives in this label instead.
- ``GrowingSlot`` (the engine's speeds, ~10 Hz): as wide as the longest line since it was last reset, so
  that a number changing width never re-lays out the bar, and never wider than its share of the window;
  a line longer than that is cut with "…" and whole in the tooltip.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer
from PySide6.QtWidgets import QLabel, QSizePolicy

from app.panels.base import CaptionLabel, ElidedLabel

MESSAGE_MS = 5000          # how long a message stays before the model's line comes back
LEAST_MODEL_PX = 120       # the left slot keeps this much however narrow the window ("demo on cpu")


def speed_line(s, paused: bool = False) -> str:
    """The status bar's line on the engine: what runs and its speeds (each sequence's decode rate and all of
    them together) while something runs; "idle" once nothing does (the speeds are rates over the last
    seconds, which would trail off for a while after a reply)."""
    if paused:
        waiting = s.running + s.waiting
        return "generation paused by the thermal guard" + (f" · {waiting} waiting" if waiting else "")
    if not s.running and not s.waiting:
        return "idle"
    queued = f", {s.waiting} queued" if s.waiting else ""
    return f"{s.running} running{queued} · {s.decode_tok_s:.1f} tok/s each · {s.aggregate_tok_s:.1f} tok/s total"


class MessageSlot(ElidedLabel):
    """A line (``set_line``) that a message (``show_message``) covers for a while; cut with "…" in the
    middle where the room is short, whole in the tooltip."""

    def __init__(self, text: str = "") -> None:
        super().__init__(text, Qt.TextElideMode.ElideMiddle)    # a saved file's name at the end stays in sight
        self.setMinimumWidth(LEAST_MODEL_PX)
        self.line = text
        self.message = ""
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.clear_message)
        self._show(text)

    def set_line(self, text: str) -> None:
        self.line = text
        if not self.message:
            self._show(text)

    def show_message(self, text: str, ms: int = MESSAGE_MS) -> None:
        self.message = text
        self._show(text)
        self._timer.start(ms)

    def clear_message(self) -> None:
        self._timer.stop()
        self.message = ""
        self._show(self.line)

    def _show(self, text: str) -> None:
        self.setText(text)
        self.setToolTip(text)


class GrowingSlot(CaptionLabel):
    """A label as wide as the longest text since ``reset`` (at most ``share`` of its window, and never below
    what ``least`` characters need), so that text changing ten times a second moves nothing around it; cut
    with "…" past that, whole in its tooltip."""

    def __init__(self, share: float = 0.36, most_px: int = 520, least_chars: int = 12) -> None:
        super().__init__("")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.share, self.most_px = share, most_px
        self.least_px = self.fontMetrics().averageCharWidth() * least_chars
        self._widest = 0
        self._watched = None

    def showEvent(self, event) -> None:
        window = self.window()
        if window is not self and window is not self._watched:     # its share follows the window's width
            window.installEventFilter(self)
            self._watched = window
        super().showEvent(event)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            self.updateGeometry()
        return False

    def set_line(self, text: str, reset: bool = False) -> None:
        """Show ``text``; ``reset`` lets the slot shrink to it (an idle engine's short line)."""
        self.setText(text)
        width = QLabel.sizeHint(self).width()               # the whole text, with the style's margins
        if width > self._widest or (reset and width != self._widest):     # the bar re-lays out only then
            self._widest = width
            self.updateGeometry()

    def _most(self) -> int:
        window = self.window()
        room = int(window.width() * self.share) if window is not self else self.most_px
        return max(self.least_px, min(self.most_px, room))

    def sizeHint(self) -> QSize:
        return QSize(min(self._widest, self._most()), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(min(self._widest, self.least_px), super().minimumSizeHint().height())
