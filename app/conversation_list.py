"""The conversations sidebar: New chat, a search over the chats' titles and messages, the saved chats (newest
first), Rename, Delete, and Undo of a delete.

From the keyboard: Down in the search box goes to the first chat found, Enter there opens it, Esc clears it
(an empty box leaves Esc to the window: it stops the reply); Enter in the
list opens the chat marked, the arrows open the next one; after a Delete the chat next to it is shown.

Each entry is its title on one line (cut with "…" to the list's width, the whole title in its tooltip)
above its time and length: a title that wrapped would push that line out of the entry."""
from __future__ import annotations

import re
import time

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics, QKeySequence, QShortcut
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QPushButton,
                               QVBoxLayout, QWidget)

from app.conversations import Conversation

UNDO_SHOWN_MS = 30_000     # how long "Deleted … Undo" stays; the file stays in the trash folder after that
TITLE = Qt.ItemDataRole.UserRole + 1      # an entry's whole title; UserRole holds its id
DETAIL = Qt.ItemDataRole.UserRole + 2     # its second line (time and length)
SEARCHED = Qt.ItemDataRole.UserRole + 3   # what the search box looks in: its title and messages, casefolded
_MARKUP = re.compile(r"[*_~`]+")          # Markdown's emphasis and code marks, which the chat does not show


def _searched(text: str) -> str:
    """What a search looks in: the text as written, and as shown ("second *line*" is found by "second line")."""
    text = text.casefold()
    shown = _MARKUP.sub("", text)
    return text if shown == text else f"{text}\n{shown}"


WRITING = "writing a reply…"      # the second line of the chat a reply is being written in


def detail_lines(updated: float, messages: int, now: float | None = None) -> str:
    """A chat's second line, as long as room allows: the forms from longest to shortest, one a line
    ("07 Dec 06:13 · 2 messages", then "06:13 · 2 messages" for today's or "07 Dec · 2 messages", then
    "06:13 · 2"): the sidebar's default width cut the longest to "2 messa…"."""
    when, today = time.localtime(updated), time.localtime(now)
    short = time.strftime("%H:%M" if when[:3] == today[:3] else "%d %b", when)
    count = f"{messages} message{'' if messages == 1 else 's'}"
    return "\n".join([f"{time.strftime('%d %b %H:%M', when)} · {count}", f"{short} · {count}",
                      f"{short} · {messages}"])


def fitting(metrics: QFontMetrics, lines: str, width: int) -> str:
    """The first of ``lines`` that fits ``width`` (the last, cut, where none does)."""
    forms = str(lines).split("\n")
    fits = next((f for f in forms if metrics.horizontalAdvance(f) <= width), None)
    return fits if fits is not None else metrics.elidedText(forms[-1], Qt.TextElideMode.ElideRight, width)


def busy_note(title: str, here: bool) -> str:
    """Why Send waits, and where the reply is being written."""
    short = title if len(title) <= 40 else title[:39] + "…"
    where = "" if here else f" in “{short}”"
    return f"A reply is being written{where}: a new message can be sent once it ends (Stop ends it now)."


class ConversationList(QWidget):
    selected = Signal(str)          # conversation id
    new_requested = Signal()
    delete_requested = Signal(str)
    rename_requested = Signal(str)  # conversation id: ask for its new title
    undo_requested = Signal()
    trash_changed = Signal()        # a chat went to the trash or came back from it (a delete, a restore, an Undo)

    def __init__(self) -> None:
        super().__init__()
        self._writing: str | None = None      # the id of the chat a reply is being written in
        self._open: str | None = None         # the id of the chat shown (the list may mark another, found)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 0, 6)
        self.new_button = QPushButton("+ New chat")
        self.new_button.clicked.connect(self.new_requested)
        lay.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.setToolTip("Show only the chats whose title or messages hold this text")
        self.search.textChanged.connect(self._filter)
        lay.addWidget(self.search)
        self.no_match = QLabel("No chat holds this text")
        self.no_match.setObjectName("replyStats")
        self.no_match.hide()
        lay.addWidget(self.no_match)
        self.busy_note = QLabel("")              # why Send waits, and which chat the reply is being written in
        self.busy_note.setObjectName("replyStats")
        self.busy_note.setWordWrap(True)
        self.busy_note.hide()
        lay.addWidget(self.busy_note)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.currentItemChanged.connect(self._changed)
        self.list.itemDoubleClicked.connect(lambda _item: self._rename())
        self.list.viewport().installEventFilter(self)      # a new width: the titles are cut again
        lay.addWidget(self.list, 1)
        lay.addWidget(self._undo_bar())
        row = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.rename_button.setToolTip("Give this chat another title (F2, or double-click it)")
        self.rename_button.clicked.connect(self._rename)
        rename_key = QShortcut(QKeySequence(Qt.Key.Key_F2), self.list)
        rename_key.setContext(Qt.ShortcutContext.WidgetShortcut)
        rename_key.activated.connect(self._rename)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Move this chat to the trash (Delete; Undo brings it back)")
        self.delete_button.clicked.connect(self._delete)
        self.list.installEventFilter(self)                  # Delete in the list: the Delete button; Enter: open
        self.search.installEventFilter(self)                # Down: to the chats found; Enter: open the first
        row.addWidget(self.rename_button)
        row.addStretch(1)
        row.addWidget(self.delete_button)
        lay.addLayout(row)
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
        """Offer Undo for a while with ``text`` ("Deleted 'title'"); an empty text takes the offer away. Said
        after every delete, restore and Undo: ``trash_changed`` tells an open list of deleted chats."""
        self.undo_label.setText(text)
        self.undo_label.setToolTip(f"The file is kept in {where}" if where else "")
        self.undo_bar.setVisible(bool(text))
        if text:
            self._undo_timer.start()
        else:
            self._undo_timer.stop()
        self.trash_changed.emit()

    def set_conversations(self, convs: list[Conversation], current_id: str | None,
                          writing: str | None = None) -> None:
        """Show ``convs`` in order (without re-emitting ``selected``); ``writing``: the chat a reply is being
        written in, which says so on its second line and cannot be deleted. The entries are updated in place,
        and one no longer needed is taken out (its item then goes with its Python wrapper): a list that
        deleted its Python-made items itself (``clear()``), a save or a switch of chats after another,
        could leave the binding a wrapper of a deleted item, and crash in it."""
        self.list.blockSignals(True)
        self._writing = writing
        self._open = current_id
        current = None
        for row, conv in enumerate(convs):
            item = self.list.item(row)
            if item is None:
                item = QListWidgetItem()
                self.list.addItem(item)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setData(TITLE, conv.title)
            item.setData(DETAIL, WRITING if conv.id == writing else detail_lines(conv.updated, len(conv.messages)))
            texts = [r.content for m in conv.messages for r in m.replies()]       # every reply version
            item.setData(SEARCHED, _searched("\n".join([conv.title, *texts])))
            item.setToolTip(conv.title)
            if conv.id == current_id:
                current = item
        while self.list.count() > len(convs):
            self.list.takeItem(self.list.count() - 1)
        if current is not None:
            self.list.setCurrentItem(current)
        else:
            self.list.setCurrentRow(-1)
        self._fit_titles()
        self._filter(self.search.text())
        self.list.blockSignals(False)
        self._busy_or_empty()

    def _filter(self, text: str) -> None:
        """Hide the chats that do not hold ``text`` (in their title or any message; case ignored). A chat
        hidden is never the one marked in the list: the chat shown is marked where the search finds it, else
        the first chat found (marked, not opened: Enter or a click opens it), else none; once the search is
        cleared, the chat shown is marked again."""
        wanted = text.strip().casefold()
        shown = 0
        for i in range(self.list.count()):
            item = self.list.item(i)
            hide = bool(wanted) and wanted not in str(item.data(SEARCHED) or "")
            item.setHidden(hide)
            shown += not hide
        self.no_match.setVisible(bool(wanted) and shown == 0 and self.list.count() > 0)
        open_item = self._item_of(self._open)
        if not wanted:
            self._mark(open_item)
        elif self._shown_current() is None:
            self._mark(open_item if open_item is not None and not open_item.isHidden() else self._first_found())
        self._busy_or_empty()

    def _item_of(self, conv_id: str | None) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            if conv_id is not None and self.list.item(i).data(Qt.ItemDataRole.UserRole) == conv_id:
                return self.list.item(i)
        return None

    def _first_found(self) -> QListWidgetItem | None:
        """The top chat the search shows (any chat where there is no search)."""
        return next((self.list.item(i) for i in range(self.list.count()) if not self.list.item(i).isHidden()), None)

    def _mark(self, item: QListWidgetItem | None) -> None:
        """Mark ``item`` (None: no chat) in the list without opening it."""
        quiet = self.list.blockSignals(True)
        if item is not None:
            self.list.setCurrentItem(item)
        else:
            self.list.setCurrentRow(-1)
        self.list.blockSignals(quiet)

    def neighbour(self, conv_id: str) -> str | None:
        """The chat to show once ``conv_id`` is deleted: the one below it in the list, else the one above;
        one the search shows before one it hides. None where it is the only chat."""
        ids = [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]
        if conv_id not in ids:
            return None
        at = ids.index(conv_id)
        near = list(range(at + 1, len(ids))) + list(range(at - 1, -1, -1))     # below first, nearest first
        found = [i for i in near if not self.list.item(i).isHidden()]
        return ids[(found or near)[0]] if near else None

    def focus_search(self) -> None:
        """Put the typing in the search box, its text selected so that new typing replaces it."""
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def _to_found(self) -> None:
        """Down in the search box: the list takes the keys, on the first chat found (marked, not opened)."""
        first = self._first_found()
        if first is not None:
            self._mark(first)
            self._busy_or_empty()
            self.list.setFocus(Qt.FocusReason.TabFocusReason)

    def _open_found(self) -> None:
        """Enter in the search box: open the first chat found."""
        first = self._first_found()
        if first is not None:
            self._mark(first)
            self._open_marked()

    def _open_marked(self) -> None:
        """Enter in the list: open the chat marked (one the search hides is never marked)."""
        item = self.list.currentItem()
        if item is not None and not item.isHidden():
            self.selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _fit_titles(self) -> None:
        """Each entry's title cut to one line of the list's width, its time and length below it."""
        metrics = self.list.fontMetrics()
        width = max(40, self.list.viewport().width() - 2 * self.list.spacing() - 12)
        for i in range(self.list.count()):
            item = self.list.item(i)
            title = metrics.elidedText(str(item.data(TITLE)), Qt.TextElideMode.ElideRight, width)
            item.setText(f"{title}\n{fitting(metrics, item.data(DETAIL), width)}")

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.list.viewport() and event.type() == QEvent.Type.Resize:
            self._fit_titles()
        if (watched is self.search and event.type() in (QEvent.Type.ShortcutOverride, QEvent.Type.KeyPress)
                and event.key() == Qt.Key.Key_Escape and self.search.text()):
            if event.type() == QEvent.Type.KeyPress:
                self.search.clear()
            event.accept()                      # Esc clears a search before it reaches Chat › Stop the reply
            return True
        if event.type() != QEvent.Type.KeyPress or event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier:
            return super().eventFilter(watched, event)
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if watched is self.list and event.matches(QKeySequence.StandardKey.Delete):
            if not event.isAutoRepeat():        # a key held down deletes one chat, not the list
                self._delete()
            return True
        if watched is self.list and enter:
            self._open_marked()
            return True
        if watched is self.search and (enter or event.key() == Qt.Key.Key_Down):
            (self._open_found if enter else self._to_found)()
            return True
        return super().eventFilter(watched, event)

    def set_busy(self, title: str | None, here: bool = True) -> None:
        """A reply is being written in the chat titled ``title`` (None: none is; ``here``: the one shown):
        other chats open, and a line under the search says why Send waits and where the reply is."""
        self.busy_note.setText(busy_note(title, here) if title is not None else "")
        self.busy_note.setVisible(title is not None)
        self._busy_or_empty()

    def _shown_current(self) -> QListWidgetItem | None:
        """The chat marked in the list, while the list shows it (a search may hide it)."""
        item = self.list.currentItem()
        return item if item is not None and not item.isHidden() else None

    def _acted_on(self) -> QListWidgetItem | None:
        """The chat Delete and Rename act on: the one shown, while the list shows it and marks it (a chat
        the search found and marked is opened first: Enter or a click)."""
        item = self._shown_current()
        return item if item is not None and item.data(Qt.ItemDataRole.UserRole) == self._open else None

    def _busy_or_empty(self) -> None:
        """Delete acts on the chat shown and marked in the list: not the one a reply is being written in, and
        none where the list is empty, a search hides the chat shown or another chat is marked."""
        item = self._acted_on()
        self.delete_button.setEnabled(item is not None and not self._writing_in(item))
        self.delete_button.setToolTip("A reply is being written in this chat: Stop it, or wait, to delete it"
                                      if item is not None and self._writing_in(item)
                                      else "Move this chat to the trash (Delete; Undo brings it back)")
        self.rename_button.setEnabled(item is not None)

    def _writing_in(self, item: QListWidgetItem) -> bool:
        return self._writing is not None and item.data(Qt.ItemDataRole.UserRole) == self._writing

    def _changed(self, item: QListWidgetItem | None, _prev: QListWidgetItem | None) -> None:
        self._busy_or_empty()
        if item is not None:
            self.selected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _rename(self) -> None:
        item = self._acted_on()
        if item is not None:
            self.rename_requested.emit(item.data(Qt.ItemDataRole.UserRole))

    def _delete(self) -> None:
        item = self._acted_on()
        if item is not None and not self._writing_in(item):
            self.delete_requested.emit(item.data(Qt.ItemDataRole.UserRole))
