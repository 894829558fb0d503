"""The conversations sidebar: New chat, the saved chats (newest first), Delete, and Undo of a delete."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout,
                               QWidget)

from app.conversations import Conversation

UNDO_SHOWN_MS = 30_000     # how long "Deleted … Undo" stays; the file stays in the trash folder after that


class ConversationList(QWidget):
    selected = Signal(str)          # conversation id
    new_requested = Signal()
    delete_requested = Signal(str)
    undo_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self._busy = False
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 0, 6)
        self.new_button = QPushButton("+ New chat")
        self.new_button.clicked.connect(self.new_requested)
        lay.addWidget(self.new_button)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setWordWrap(True)
        self.list.currentItemChanged.connect(self._changed)
        lay.addWidget(self.list, 1)
        lay.addWidget(self._undo_bar())
        row = QHBoxLayout()
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Move this chat to the trash (Undo brings it back)")
        self.delete_button.clicked.connect(self._delete)
        row.addStretch(1)
        row.addWidget(self.delete_button)
        lay.addLayout(row)
        self.setMinimumWidth(190)
        self.setMaximumWidth(280)

    def _undo_bar(self) -> QFrame:
        self.undo_bar = QFrame()
        self.undo_bar.setObjectName("undoBar")
        row = QHBoxLayout(self.undo_bar)
        row.setContentsMargins(0, 0, 0, 0)
        self.undo_label = QLabel("")
        self.undo_label.setWordWrap(True)
        self.undo_button = QPushButton("Undo")
        self.undo_button.clicked.connect(self.undo_requested)
        row.addWidget(self.undo_label, 1)
        row.addWidget(self.undo_button)
        self.undo_bar.hide()
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(UNDO_SHOWN_MS)
        self._undo_timer.timeout.connect(self.undo_bar.hide)
        return self.undo_bar

    def show_undo(self, text: str, where: str = "") -> None:
        """Offer Undo for a while with ``text`` ("Deleted 'title'"); an empty text takes the offer away."""
        self.undo_label.setText(text)
        self.undo_label.setToolTip(f"The file is kept in {where}" if where else "")
        self.undo_bar.setVisible(bool(text))
        if text:
            self._undo_timer.start()
        else:
            self._undo_timer.stop()

    def set_conversations(self, convs: list[Conversation], current_id: str | None) -> None:
        """Rebuild the list (without re-emitting ``selected``)."""
        self.list.blockSignals(True)
        self.list.clear()
        for conv in convs:
            when = time.strftime("%d %b %H:%M", time.localtime(conv.updated))
            item = QListWidgetItem(f"{conv.title}\n{when} · {len(conv.messages)} messages")
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            self.list.addItem(item)
            if conv.id == current_id:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        self._busy_or_empty()

    def set_busy(self, busy: bool) -> None:
        """While a reply streams the chats cannot be switched or deleted."""
        self._busy = busy
        self.new_button.setEnabled(not busy)
        self._busy_or_empty()

    def _busy_or_empty(self) -> None:
        """Delete acts on the chat selected in the list: none while a reply streams or the list is empty."""
        self.delete_button.setEnabled(not self._busy and self.list.count() > 0)

    def _changed(self, item: QListWidgetItem | None, _prev: QListWidgetItem | None) -> None:
        if item is not None:
            self.selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _delete(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.delete_requested.emit(item.data(Qt.ItemDataRole.UserRole))
