"""The conversations sidebar: New chat, the saved chats (newest first), Delete."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

from app.conversations import Conversation


class ConversationList(QWidget):
    selected = Signal(str)          # conversation id
    new_requested = Signal()
    delete_requested = Signal(str)

    def __init__(self) -> None:
        super().__init__()
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
        row = QHBoxLayout()
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete)
        row.addStretch(1)
        row.addWidget(self.delete_button)
        lay.addLayout(row)
        self.setMinimumWidth(190)
        self.setMaximumWidth(280)

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

    def _changed(self, item: QListWidgetItem | None, _prev: QListWidgetItem | None) -> None:
        if item is not None:
            self.selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _delete(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.delete_requested.emit(item.data(Qt.ItemDataRole.UserRole))
