"""Chat logic: the current conversation, its bubbles, saving, and the reply in flight.

Turns the chat pane's intentions into bridge requests and the bridge's text and stats into bubbles.
Every change to a conversation is saved at once (atomic JSON), so a crash loses nothing.
"""
from __future__ import annotations

import uuid

from PySide6.QtCore import QObject, Signal

from app.chat_pane import ChatPane
from app.chat_view import MessageBubble
from app.conversation_list import ConversationList
from app.conversations import Conversation, ConversationStore, StoredMessage
from app.messages import ChatMessage, ModelDescription, ReplyRequest, ReplyStats, TextBatch

TITLE_CHARS = 40


class ChatController(QObject):
    """Owns the conversations and the one chat reply that may be streaming."""

    reply_done = Signal(object)     # ReplyStats of a chat reply (for the status bar and tests)

    def __init__(self, pane: ChatPane, sidebar: ConversationList, store: ConversationStore, bridge) -> None:
        super().__init__()
        self.pane, self.sidebar, self.store, self.bridge = pane, sidebar, store, bridge
        self.conversations = store.load_all()
        self.current = self.conversations[0] if self.conversations else Conversation()
        self.model: ModelDescription | None = None
        self.live_id: str | None = None
        self.live_bubble: MessageBubble | None = None
        self._bubbles: list[MessageBubble] = []
        pane.send_requested.connect(self.send)
        pane.stop_requested.connect(self.stop)
        pane.regenerate_requested.connect(self.regenerate)
        pane.edit_requested.connect(self.edit_last)
        sidebar.selected.connect(self.open)
        sidebar.new_requested.connect(self.new_chat)
        sidebar.delete_requested.connect(self.delete)
        self._show_current()

    # --- conversations -----------------------------------------------------------------------
    def _refresh_sidebar(self) -> None:
        self.conversations.sort(key=lambda c: c.updated, reverse=True)
        self.sidebar.set_conversations(self.conversations, self.current.id)

    def _show_current(self) -> None:
        self.pane.view.clear()
        self._bubbles = [self.pane.view.add(m.role, m.content, stats=m.stats) for m in self.current.messages]
        self.pane.settings_box.system_prompt.setPlainText(self.current.system_prompt)
        self._refresh_sidebar()
        self._update_buttons()

    def _save(self) -> None:
        self.current.system_prompt = self.pane.settings_box.system_prompt.toPlainText()
        if self.current not in self.conversations:
            self.conversations.append(self.current)
        self.store.save(self.current)
        self._refresh_sidebar()

    def open(self, conv_id: str) -> None:
        """Show a saved conversation (not while a reply streams)."""
        if self.live_id is not None or conv_id == self.current.id:
            self._refresh_sidebar()
            return
        self.current = next((c for c in self.conversations if c.id == conv_id), self.current)
        self._show_current()

    def new_chat(self) -> None:
        if self.live_id is None:
            self.current = Conversation(system_prompt=self.pane.settings_box.system_prompt.toPlainText())
            self._show_current()

    def delete(self, conv_id: str) -> None:
        if self.live_id is not None:
            return
        self.store.delete(conv_id)
        self.conversations = [c for c in self.conversations if c.id != conv_id]
        if conv_id == self.current.id:
            self.current = self.conversations[0] if self.conversations else Conversation()
        self._show_current()

    # --- model ---------------------------------------------------------------------------------
    def set_model(self, model: ModelDescription | None) -> None:
        """A model was loaded (or failed to): completion mode when it has no chat template."""
        self.model = model
        if model is None:
            self.pane.mode_label.setText("No model loaded")
        elif model.has_chat_template:
            self.pane.mode_label.setText("Chat mode (the model's chat template)")
        else:
            self.pane.mode_label.setText("Completion mode: this model has no chat template, "
                                         "so your text is continued as written")
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.pane.set_busy(self.live_id is not None, can_send=self.model is not None)

    def notice(self, text: str) -> None:
        """A line from Strata in the transcript (thermal guard, errors); not saved."""
        self.pane.view.add("notice", text)

    # --- replies -------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        """Add the user's message and ask for a reply."""
        if self.live_id is not None or self.model is None:
            return
        if not self.current.messages:
            self.current.title = text.splitlines()[0][:TITLE_CHARS] or "Chat"
        self.current.messages.append(StoredMessage("user", text))
        self._bubbles.append(self.pane.view.add("user", text))
        self._save()
        self._start_reply()

    def _request(self, request_id: str) -> ReplyRequest:
        settings = self.pane.settings_box.settings()
        if not self.model.has_chat_template:
            last_user = next(m.content for m in reversed(self.current.messages) if m.role == "user")
            return ReplyRequest(request_id, settings, prompt=last_user)
        system = self.pane.settings_box.system_prompt.toPlainText().strip()
        msgs = ([ChatMessage("system", system)] if system else []) + \
            [ChatMessage(m.role, m.content) for m in self.current.messages]
        return ReplyRequest(request_id, settings, messages=tuple(msgs))

    def _start_reply(self) -> None:
        self.live_id = f"chat-{uuid.uuid4().hex[:10]}"
        self.live_bubble = self.pane.view.add("assistant", streaming=True)
        self.live_bubble.set_stats("waiting for the first token…")
        self._update_buttons()
        self.bridge.submit(self._request(self.live_id))

    def on_text(self, batch: TextBatch) -> None:
        """Coalesced text from the bridge."""
        for chunk in batch.chunks:
            if chunk.request_id == self.live_id and self.live_bubble is not None:
                if self.live_bubble.stats.isVisible() and not self.live_bubble.text:
                    self.live_bubble.set_stats("")
                self.live_bubble.append(chunk.text)

    def on_finished(self, stats: ReplyStats) -> None:
        """A reply ended (stop, length, abort or error): keep its text and its stats line."""
        if stats.request_id != self.live_id or self.live_bubble is None:
            return
        line = stats.summary() if stats.error is None else f"{stats.summary()} — {stats.error}"
        self.live_bubble.finish(line)
        self.current.messages.append(StoredMessage("assistant", self.live_bubble.text, line))
        self._bubbles.append(self.live_bubble)
        self.live_id, self.live_bubble = None, None
        self._save()
        self._update_buttons()
        self.reply_done.emit(stats)

    def stop(self) -> None:
        """Stop the reply in flight; what it said so far is kept."""
        if self.live_id is not None:
            self.bridge.cancel(self.live_id)

    def _drop_last(self) -> StoredMessage:
        msg = self.current.messages.pop()
        self.pane.view.remove(self._bubbles.pop())
        return msg

    def regenerate(self) -> None:
        """Replace the last reply with a new one."""
        if self.live_id is not None or self.model is None or not self.current.messages:
            return
        if self.current.messages[-1].role == "assistant":
            self._drop_last()
        if self.current.messages and self.current.messages[-1].role == "user":
            self._save()
            self._start_reply()

    def edit_last(self) -> None:
        """Take the last user message (and its reply) back into the input box."""
        if self.live_id is not None or not any(m.role == "user" for m in self.current.messages):
            return
        while self.current.messages[-1].role != "user":
            self._drop_last()
        text = self._drop_last().content
        self.pane.input.setPlainText(text)
        self._save()
