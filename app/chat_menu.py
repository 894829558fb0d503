"""The Chat menu. While it is open, an item that cannot apply to the shown chat is greyed out: Stop with no
reply being written in it, Regenerate and Edit with no message of the user's (or a reply still coming),
Rename on a chat not yet saved. Once it closes every item is enabled again, so that the shortcuts
(Esc, Ctrl+R) keep working whatever the state was when the menu last opened; each handler checks for
itself and does nothing where it cannot apply. A menu asked to show but not shown (a desktop's global
menu reading the items over DBus, which need not say when it is done) is enabled again at once."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu

if TYPE_CHECKING:
    from app.chat_controller import ChatController


def add_action(menu: QMenu, text: str, slot: Callable, shortcut: str = "") -> QAction:
    action = menu.addAction(text)
    action.triggered.connect(slot)
    if shortcut:
        action.setShortcut(shortcut)
    return action


class ChatMenu:
    """The items of ``menu`` for ``chat`` (a ChatController); ``search`` and ``trash`` open the chat list's
    search and the Deleted chats window."""

    def __init__(self, menu: QMenu, chat: "ChatController", search: Callable, trash: Callable) -> None:
        self.chat, self.menu = chat, menu
        self.new = add_action(menu, "&New chat", lambda: chat.new_chat(), "Ctrl+N")
        self.stop = add_action(menu, "&Stop the reply", lambda: chat.stop_shown(), "Esc")
        self.regenerate = add_action(menu, "&Regenerate the last reply", lambda: chat.regenerate(), "Ctrl+R")
        self.edit_last = add_action(menu, "Edit the &last message", lambda: chat.edit_last())
        self.rename = add_action(menu, "Rena&me this chat…", lambda: chat.rename(chat.current.id))
        self.search = add_action(menu, "S&earch chats", search, "Ctrl+F")
        menu.addSeparator()
        self.trash = add_action(menu, "&Deleted chats…", trash)
        menu.aboutToShow.connect(self.grey_out)
        menu.aboutToHide.connect(self.enable_all)

    def available(self) -> dict[QAction, bool]:
        """Whether each item that depends on the shown chat applies to it now."""
        chat = self.chat
        idle, asked = chat.live is None, chat.current.has_user_message
        return {self.stop: not idle and chat.live.conversation is chat.current,
                self.regenerate: idle and chat.model is not None and asked,
                self.edit_last: idle and asked,
                self.rename: chat.library.find(chat.current.id) is not None}

    def grey_out(self) -> None:
        for action, ok in self.available().items():
            action.setEnabled(ok)
        QTimer.singleShot(0, self._unless_shown)

    def _unless_shown(self) -> None:
        if not self.menu.isVisible():
            self.enable_all()

    def enable_all(self) -> None:
        for action in self.available():
            action.setEnabled(True)
