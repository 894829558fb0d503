"""The conversations in memory and their files.

One list, newest first, saved through the writer thread (the GUI never waits for the disk); a delete goes to
the trash and Undo brings it back; every save that fails is told once, and so is the first that works again.
"""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, Signal

from app.conversations import Conversation, ConversationStore
from app.store_writer import RestoreJob, SaveJob, StoreWriter, TrashJob, WriteResult


class ConversationLibrary(QObject):
    """The store's conversations and what happens to their files."""

    store_line = Signal(str)        # a write failed (once per distinct failure), or "" once writing works again
    _written = Signal(object)       # WriteResult, from the writer thread (queued to this thread)

    def __init__(self, store: ConversationStore) -> None:
        super().__init__()
        self.store = store
        loaded = store.load_all()
        self.conversations: list[Conversation] = loaded.conversations
        self.problems: list[str] = loaded.problems      # files set aside or unreadable at start, one line each
        self.deleted: list[Conversation] = []          # newest last: what Undo brings back
        self._failing, self._last_line = False, ""
        self.writer = StoreWriter(store, self._written.emit)
        self._written.connect(self._on_written)

    def find(self, conv_id: str) -> Conversation | None:
        return next((c for c in self.conversations if c.id == conv_id), None)

    def sort(self) -> None:
        self.conversations.sort(key=lambda c: c.updated, reverse=True)

    def save(self, conv: Conversation, touch: bool = True) -> None:
        """Add ``conv`` if it is new and hand a snapshot of it to the writer (returns at once); ``touch``:
        it changed (its time moves it to the top of the list), else only how it is shown did."""
        if conv not in self.conversations:
            self.conversations.append(conv)
        if touch:
            conv.updated = time.time()
        self.writer.put(SaveJob(conv.id, conv.to_json()))

    def delete(self, conv: Conversation) -> None:
        """Move ``conv`` to the trash folder (``undo`` brings it back)."""
        self.conversations.remove(conv)
        self.deleted.append(conv)
        self.writer.put(TrashJob(conv.id))

    def report_unwritable(self) -> None:
        """Say at once (not at the first save) that the folder cannot be written; a later save that goes
        through clears it, as after a failed one."""
        line = self.store.unwritable()
        if line is not None:
            self._failing, self._last_line = True, line
            self.store_line.emit(line)

    def restore(self, conv: Conversation) -> None:
        """Bring ``conv`` (read from the trash folder) back into the list; its file moves back."""
        self.deleted = [c for c in self.deleted if c.id != conv.id]
        if self.find(conv.id) is None:
            self.conversations.append(conv)
        self.writer.put(RestoreJob(conv.id))
        self.sort()

    def undo(self) -> Conversation | None:
        """Bring back the conversation deleted last."""
        if not self.deleted:
            return None
        conv = self.deleted.pop()
        self.writer.put(RestoreJob(conv.id))
        self.save(conv, touch=False)    # as it was, in its place; also written where the file reached neither
        return conv

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the writer to catch up (tests; the window's close)."""
        return self.writer.flush(timeout_s)

    def close(self) -> bool:
        """Finish writing (failed saves tried once more); False if a chat is only in a rescue copy
        (``writer.rescued``) or time ran out."""
        return self.writer.close()

    def _on_written(self, result: WriteResult) -> None:
        if result.error is not None:
            self._failing = True
            if result.error != self._last_line:
                self._last_line = result.error
                self.store_line.emit(result.error)
        elif self._failing and isinstance(result.job, SaveJob):
            self._failing, self._last_line = False, ""
            self.store_line.emit("")
