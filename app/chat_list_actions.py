"""What the chat list does to whole chats: rename, delete to the trash with Undo, restore from the trash,
and the unsent text of a chat whose damaged file was set aside. A part of :class:`app.chat_controller.
ChatController`, which holds the state these act on (the library, the chat shown, the reply in flight)."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.conversations import Conversation

TITLE_CHARS = 40
KEPT_DRAFT_TITLE = "Unsent text of a damaged chat"     # the chat that takes it when the chat's file was set aside


class ChatListActions:
    """Rename, delete, restore and undo for :class:`app.chat_controller.ChatController`."""

    def _keep_drafts_of_damaged_chats(self) -> list[str]:
        """The unsent text of a chat whose damaged file was set aside (now or at an earlier start) moves to
        a new chat of its own, in the list: that file is never read again, and the text must not go with it.
        The text leaves the old chat only once the new one is on disk (else the next start tries again),
        so a kill or a failed write in between keeps it. A line for each."""
        lines: list[str] = []
        for conv_id in self.prefs.drafted():
            aside = self.store.set_aside_files(conv_id) if self.library.find(conv_id) is None else []
            if not aside or self.store.path_of(conv_id).exists():
                continue
            conv = Conversation(title=KEPT_DRAFT_TITLE)
            self.library.save(conv)
            self.prefs.set_draft(self.prefs.draft(conv_id), conv.id)
            if self.library.flush(5) and self.store.path_of(conv.id).exists():
                self.prefs.set_draft("", conv_id)
            self.prefs.sync()
            lines.append(f"The unsent text of {conv_id}.json (kept as {aside[-1].name}) is in a new chat, "
                         f"“{KEPT_DRAFT_TITLE}”, at the top of the list.")
        self.library.sort()
        return lines

    def rename(self, conv_id: str) -> None:
        """Ask for another title for a conversation; an empty one or Cancel leaves it as it was. Its
        place in the list stays: a new title is not a new message."""
        conv = self.library.find(conv_id)
        if conv is None:
            return
        title = self.ask_text("Rename chat", "Title:", conv.title)
        title = " ".join((title or "").split())[:TITLE_CHARS * 3]       # one line, of a sane length
        if not title or title == conv.title:
            return
        conv.title = title
        self.library.save(conv, touch=False)
        self._refresh_sidebar()
        self._update_buttons()                  # the line over the list may name it

    def delete(self, conv_id: str) -> None:
        """Move a conversation to the trash folder; Undo in the sidebar brings it back. Not the chat a reply
        is being written in. The chat shown goes to the one next to it in the list (below it, else above
        it); the keys stay in the list where they were in the sidebar, for the next Delete or the Undo
        under it, or go to the message box once no chat is left, where typing starts a new one."""
        conv = self.library.find(conv_id)
        if conv is None or (self.live is not None and conv is self.live.conversation):
            return
        focus = QApplication.focusWidget()
        in_sidebar = focus is not None and self.sidebar.isAncestorOf(focus)
        near = self.library.find(self.sidebar.neighbour(conv_id) or "")
        if conv is self.current:            # its edits first: nothing saves it once it is in the trash
            self._keep_edits_now()
        self.library.delete(conv)
        if conv is self.current:            # its unsent text stays with it, for Undo
            self._show_chat(near or (self.conversations[0] if self.conversations else Conversation()))
        else:
            self._refresh_sidebar()
        self._offer_undo()
        if in_sidebar:
            box = self.pane.input
            (box if not self.conversations and box.isEnabled() else self.sidebar.list).setFocus()

    def trashed(self) -> list[Conversation]:
        """The chats in the trash folder that are not in the list (an Undo may have brought one back)."""
        self.library.flush(5)                  # a delete still on its way to the trash is there first
        return [c for c in self.store.trashed() if self.library.find(c.id) is None]

    def restore(self, conv_id: str) -> str | None:
        """Bring a chat back from the trash folder, and show it; else why not (one line)."""
        conv = next((c for c in self.store.trashed() if c.id == conv_id), None)
        if conv is None or self.library.find(conv_id) is not None:
            return "That chat is no longer in the trash folder."
        self.library.restore(conv)
        self._show_chat(conv)
        self._offer_undo()
        return None

    def undo_delete(self) -> None:
        """Bring back the conversation deleted last, and show it."""
        conv = self.library.undo()
        if conv is not None:
            self._show_chat(conv)
            self._offer_undo()

    def _offer_undo(self) -> None:
        deleted = self.library.deleted
        text = f"Deleted “{deleted[-1].title}”" if deleted else ""
        self.sidebar.show_undo(text, str(self.store.trash_folder))
