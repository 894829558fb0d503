"""Chat › Deleted chats…: the chats in the trash folder, each brought back to the list by Restore."""
from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import Qt, SignalInstance
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QLabel, QListWidget, QListWidgetItem, QPushButton,
                               QVBoxLayout, QWidget)

from app.conversations import Conversation


class TrashDialog(QDialog):
    """``trashed()`` lists the deleted chats (asked again after each restore, and each time ``changed`` fires);
    ``restore(id)`` brings one back, or says why it cannot (one line, shown under the list)."""

    def __init__(self, trashed: Callable[[], list[Conversation]], restore: Callable[[str], str | None], where: str,
                 parent: QWidget | None = None, changed: SignalInstance | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Deleted chats")
        self._trashed, self._restore = trashed, restore
        lay = QVBoxLayout(self)
        note = QLabel(f"Deleted chats are kept in {where} until you remove them there.")
        note.setWordWrap(True)
        lay.addWidget(note)
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)      # a long title ends in "…" (whole in its tip)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.itemDoubleClicked.connect(lambda _item: self._restore_selected())
        self.list.currentItemChanged.connect(lambda *_a: self._update())
        lay.addWidget(self.list, 1)
        self.empty = QLabel("The trash holds no chats.")
        lay.addWidget(self.empty)
        self.why = QLabel("")
        self.why.setWordWrap(True)
        self.why.hide()
        lay.addWidget(self.why)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.restore_button = QPushButton("Restore")
        self.restore_button.setToolTip("Bring the selected chat back to the list of chats")
        buttons.addButton(self.restore_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.restore_button.clicked.connect(self._restore_selected)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.resize(420, 360)
        self.refresh()
        if changed is not None:          # a delete or an Undo under the chat list while the dialog is open
            changed.connect(self.refresh)

    def refresh(self) -> None:
        self.list.clear()
        for conv in self._trashed():
            n = len(conv.messages)
            when = time.strftime("%d %b %Y %H:%M", time.localtime(conv.updated))
            item = QListWidgetItem(f"{conv.title}\n{when} · {n} message{'' if n == 1 else 's'}")
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setToolTip(conv.title)
            self.list.addItem(item)
        if self.list.count():
            self.list.setCurrentRow(0)
        self._update()

    def _update(self) -> None:
        self.empty.setVisible(self.list.count() == 0)
        self.restore_button.setEnabled(self.list.currentItem() is not None)

    def _restore_selected(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        why = self._restore(item.data(Qt.ItemDataRole.UserRole))
        self.why.setText(why or "")
        self.why.setVisible(bool(why))
        self.refresh()
