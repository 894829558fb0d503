"""The chat transcript: message bubbles; a streaming reply shows plain text and turns each finished
Markdown block (paragraph, list, fenced code) into rendered text once, never re-rendering the whole reply."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from app.markdown_blocks import Block, split_all, split_finished

#: While streaming, an unfinished paragraph longer than this is shown as several plain labels, so each
#: update lays out only the last few hundred characters, not the whole paragraph again.
TAIL_CHUNK_CHARS = 400
_SELECTABLE = Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse


def _label(text: str, fmt: Qt.TextFormat, name: str = "") -> QLabel:
    label = QLabel()
    label.setTextFormat(fmt)
    label.setWordWrap(True)
    label.setTextInteractionFlags(_SELECTABLE)
    label.setOpenExternalLinks(True)
    if name:
        label.setObjectName(name)
    label.setText(text)
    return label


def block_widget(block: Block) -> QLabel:
    """One rendered block: Markdown text, or a monospaced code box."""
    if block.kind == "code":
        label = _label(block.text, Qt.TextFormat.PlainText, "codeBlock")
        label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        if block.lang:
            label.setToolTip(block.lang)
        return label
    return _label(block.text, Qt.TextFormat.MarkdownText)


class MessageBubble(QFrame):
    """One message. Assistant bubbles stream: ``append`` then ``finish``."""

    ROLE_NAMES = {"user": "You", "assistant": "Assistant", "notice": "Strata"}

    def __init__(self, role: str, text: str = "", streaming: bool = False) -> None:
        super().__init__()
        self.role = role
        self.text = ""
        self._pending = ""          # text not yet part of a finished block
        self._frozen: list[QLabel] = []   # plain labels holding the start of a long unfinished paragraph
        self._frozen_chars = 0
        self.setObjectName({"user": "userBubble", "notice": "noticeBubble"}.get(role, "assistantBubble"))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 8)
        lay.setSpacing(4)
        head = QHBoxLayout()
        name = QLabel(self.ROLE_NAMES.get(role, role))
        name.setObjectName("role")
        head.addWidget(name)
        head.addStretch(1)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setFlat(True)
        self.copy_button.setToolTip("Copy this message as Markdown")
        self.copy_button.clicked.connect(self.copy)
        head.addWidget(self.copy_button)
        lay.addLayout(head)
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        lay.addLayout(self.body)
        self.tail = _label("", Qt.TextFormat.PlainText)
        lay.addWidget(self.tail)
        self.stats = QLabel("")
        self.stats.setObjectName("replyStats")
        self.stats.setWordWrap(True)
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats.hide()
        lay.addWidget(self.stats)
        self.streaming = streaming
        if text:
            self.append(text)
        if not streaming:
            self.finish()

    def append(self, text: str) -> None:
        """More streamed text: finished blocks are rendered once, the rest shows as plain text."""
        self.text += text
        self._pending += text
        blocks, self._pending = split_finished(self._pending)
        if blocks:
            self._drop_frozen()
        for block in blocks:
            self.body.addWidget(block_widget(block))
        shown = self._pending[self._frozen_chars:]
        cut = shown.rfind(" ", 0, len(shown) - TAIL_CHUNK_CHARS // 4) if len(shown) > TAIL_CHUNK_CHARS else -1
        if cut > 0:
            frozen = _label(shown[:cut], Qt.TextFormat.PlainText)
            self.body.addWidget(frozen)
            self._frozen.append(frozen)
            self._frozen_chars += cut + 1
            shown = shown[cut + 1:]
        self.tail.setText(shown)
        self.tail.setVisible(bool(shown))

    def _drop_frozen(self) -> None:
        for label in self._frozen:
            self.body.removeWidget(label)
            label.deleteLater()
        self._frozen, self._frozen_chars = [], 0

    def finish(self, stats_line: str = "") -> None:
        """The message is complete: render what is left and show the reply's stats."""
        self.streaming = False
        self._drop_frozen()
        for block in split_all(self._pending):
            self.body.addWidget(block_widget(block))
        self._pending = ""
        self.tail.clear()
        self.tail.hide()
        self.set_stats(stats_line)

    def set_stats(self, line: str) -> None:
        self.stats.setText(line)
        self.stats.setVisible(bool(line))

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)


class ChatView(QScrollArea):
    """A scrolling column of bubbles that follows the newest text while the user is at the bottom."""

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(12, 12, 12, 12)
        self.column.setSpacing(10)
        self.column.addStretch(1)
        self.setWidget(inner)
        self.bubbles: list[MessageBubble] = []
        self._follow = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda v: setattr(self, "_follow", v >= bar.maximum() - 24))
        bar.rangeChanged.connect(self._range_changed)

    def _range_changed(self, _lo: int, hi: int) -> None:
        if self._follow:
            QTimer.singleShot(0, lambda: self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))

    def add(self, role: str, text: str = "", streaming: bool = False, stats: str = "") -> MessageBubble:
        """Append a bubble and return it."""
        bubble = MessageBubble(role, text, streaming)
        if stats:
            bubble.set_stats(stats)
        self.column.insertWidget(self.column.count() - 1, bubble)
        self.bubbles.append(bubble)
        self._follow = True
        return bubble

    def remove_last(self, count: int = 1) -> None:
        """Drop the newest ``count`` bubbles (regenerate, edit)."""
        for _ in range(min(count, len(self.bubbles))):
            bubble = self.bubbles.pop()
            self.column.removeWidget(bubble)
            bubble.deleteLater()

    def remove(self, bubble: MessageBubble) -> None:
        """Drop one bubble (regenerate and edit remove the last exchange)."""
        if bubble in self.bubbles:
            self.bubbles.remove(bubble)
            self.column.removeWidget(bubble)
            bubble.deleteLater()

    def clear(self) -> None:
        self.remove_last(len(self.bubbles))
