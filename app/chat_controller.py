"""Chat logic: the current conversation, its bubbles, saving, and the reply in flight.

Turns the chat pane's intentions into bridge requests and the bridge's text and stats into bubbles.
Every change goes to the store's writer thread at once. A streaming reply's first text is saved at once,
and from then on the reply is at most ``STREAM_SAVE_MS`` behind the screen (see save_pacing); it is marked
interrupted until it ends, so a crash loses at most that much of what was on screen and the next start says
the reply was cut short. Nothing the user saw is
removed without asking: Regenerate keeps the earlier replies as versions to page through, Delete moves
the file to the trash with an Undo, and a store that cannot be written is reported while the chat goes on.
"""
from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass
from functools import partial
from PySide6.QtCore import QObject, QSettings, QTimer, Signal
from PySide6.QtGui import QTextCursor

from app.chat_list_actions import TITLE_CHARS, ChatListActions
from app.chat_pane import ChatPane
from app.chat_settings import ChatPrefs
from app.chat_view import MessageBubble
from app.conversation_library import ConversationLibrary
from app.conversation_list import ConversationList
from app.conversations import Conversation, ConversationStore, Reply, StoredMessage
from app.dialogs import AskText, Confirm, ask, ask_text
from app.messages import ChatMessage, ContextUsage, ModelDescription, ReplyRequest, ReplyStats, TextBatch
from app.save_pacing import SavePacer

FIRST_SAVE_MS = 150       # after the save made at once of a reply's first text or a first keystroke, the next one
STREAM_SAVE_MS = 1000     # a streaming reply on disk is at most this far behind the screen
EDITS_SAVE_MS = 1000      # the unsent text and the system prompt are kept this soon after the first unkept keystroke
SHOWN_AT_ONCE = 12        # messages of a chat put on screen when it opens (a screenful); the earlier ones follow
FILL_SLICE_S = 0.012      # time a turn of the event loop makes earlier messages in (their layout follows it)
# messages of a chat on screen before the earlier ones wait for "Show earlier messages" (about a second of work)
SHOWN_MESSAGES = 200
INTERRUPTED_NOTE = "interrupted — Strata stopped before this reply finished"   # a quit, a crash, a kill

WAITING = "waiting for the first token…"


@dataclass
class _Live:
    """The reply that is streaming: which request, into which message of which chat, its text so far, and
    its bubble while that chat is shown (None while another one is)."""

    request_id: str
    conversation: Conversation
    message: StoredMessage
    bubble: MessageBubble | None
    max_tokens: int
    text: str = ""
    reasoning: str = ""


class ChatController(ChatListActions, QObject):
    """Owns the conversations and the one chat reply that may be streaming."""

    reply_done = Signal(object)     # ReplyStats of a chat reply (for the status bar and tests)
    store_error = Signal(str)       # one line when saving fails or a file was set aside; "" once saving works again
    prefs_error = Signal(str)       # one line when the settings file cannot be written; "" once it can again

    def __init__(self, pane: ChatPane, sidebar: ConversationList, store: ConversationStore, bridge,
                 settings: QSettings | None = None) -> None:
        super().__init__(pane)     # dies with the pane, on the GUI thread (not whenever a collector runs)
        self.pane, self.sidebar, self.store, self.bridge = pane, sidebar, store, bridge
        self.prefs = ChatPrefs(settings)
        self.confirm: Confirm = partial(ask, pane)
        self.ask_text: AskText = partial(ask_text, pane)
        self.model: ModelDescription | None = None
        self.live: _Live | None = None
        # one per message of the current conversation (None: an earlier one not on screen yet)
        self._bubbles: list[MessageBubble | None] = []
        self._context_total = 0
        self._system_edited = False
        self._prefs_problem = ""                 # the settings file's last write problem told
        self._fill_epoch = 0                           # which chat's earlier messages are being put on screen
        self._fill_until = 0                           # the earliest message index put on screen without asking
        # what was left out of each reply's prompt, by chat: shown above the reply whenever its chat is (not saved)
        self._reply_notes: dict[str, list[tuple[StoredMessage, str]]] = {}
        self.library = ConversationLibrary(store)
        self.library.store_line.connect(self._on_store_line)
        kept_drafts = self._keep_drafts_of_damaged_chats()
        # a chat made now for a damaged chat's unsent text is the newest: shown first, so the text is seen
        self.current = self.conversations[0] if kept_drafts else self._first_chat()
        self.stream_saves = SavePacer(self, FIRST_SAVE_MS, STREAM_SAVE_MS)
        self.stream_saves.save_due.connect(self._save_live)
        self.edit_saves = SavePacer(self, FIRST_SAVE_MS, EDITS_SAVE_MS)
        self.edit_saves.save_due.connect(self._keep_edits)
        self._restore_prefs()
        self._connect()
        self._show_current()
        self._report_problems(self.library.problems + kept_drafts)
        QTimer.singleShot(0, self, self.library.report_unwritable)   # once the window listens to the store

    def _first_chat(self) -> Conversation:
        """The chat shown at start: the one shown last (a new one never saved comes back where it holds
        unsent text), else the most recent one."""
        last = self.prefs.current_chat()
        shown = self.library.find(last) if last else None
        if shown is not None:
            return shown
        if last and not self.store.holds(last) and self.prefs.draft(last):   # never a new chat over a file
            return Conversation(id=last)
        return self.conversations[0] if self.conversations else Conversation()

    def _restore_prefs(self) -> None:
        self.pane.settings_box.set_settings(self.prefs.generation())
        self.pane.set_enter_sends(self.prefs.enter_sends())
        box_draft = self.prefs.take_box_draft()          # an earlier version's one text for every chat
        if box_draft and not self.prefs.draft(self.current.id):
            self.prefs.set_draft(box_draft, self.current.id)
        # Drafts of chats this store does not hold stay: the chat may be in its trash (Undo brings the text
        # back), in another data folder (XDG_DATA_HOME set for one start), or on a disk not mounted now.
        self.prefs.set_current_chat(self.current.id)
        if not self.pane.input.toPlainText():
            self._put_draft(self.prefs.draft(self.current.id))

    def _connect(self) -> None:
        pane, box = self.pane, self.pane.settings_box
        pane.send_requested.connect(self.send)
        pane.view.earlier_requested.connect(self._show_earlier)
        pane.stop_requested.connect(self.stop)
        pane.regenerate_requested.connect(self.regenerate)
        pane.edit_requested.connect(self.edit_last)
        pane.enter_sends_changed.connect(self.prefs.set_enter_sends)
        box.changed.connect(lambda: self.prefs.set_generation(box.settings()))
        box.system_prompt.textChanged.connect(self._system_prompt_edited)
        pane.input.textChanged.connect(self._edited)
        self.sidebar.selected.connect(self.open)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.delete_requested.connect(self.delete)
        self.sidebar.rename_requested.connect(self.rename)
        self.sidebar.undo_requested.connect(self.undo_delete)

    @property
    def conversations(self) -> list[Conversation]:
        return self.library.conversations

    @property
    def live_id(self) -> str | None:
        return self.live.request_id if self.live is not None else None

    @property
    def live_bubble(self) -> MessageBubble | None:
        return self.live.bubble if self.live is not None else None

    def _live_here(self) -> bool:
        """Whether the reply in flight is the shown chat's."""
        return self.live is not None and self.live.conversation is self.current

    # --- conversations -----------------------------------------------------------------------
    def _refresh_sidebar(self) -> None:
        self.library.sort()
        writing = self.live.conversation.id if self.live is not None else None
        self.sidebar.set_conversations(self.conversations, self.current.id, writing)

    def _show_current(self) -> None:
        """Show the current chat: its last SHOWN_AT_ONCE messages now, the earlier ones a batch per turn
        of the event loop above them, so that a long chat opens (and the window appears) at once."""
        self.pane.view.clear()
        self._notes_above: dict[MessageBubble, list[MessageBubble]] = {}
        messages = self.current.messages
        first = max(0, len(messages) - SHOWN_AT_ONCE)
        self._bubbles = [None] * first + [self._add_bubble(m) for m in messages[first:]]
        self._attach_live()
        self._show_reply_notes()
        self._fill_epoch += 1
        self._fill_until = max(0, len(messages) - SHOWN_MESSAGES)
        if first:
            QTimer.singleShot(0, self.pane, partial(self._fill_earlier, self._fill_epoch))
        self.pane.settings_box.system_prompt.setPlainText(self.current.system_prompt)
        self._refresh_sidebar()
        self._update_buttons()
        self._show_context()

    def _fill_earlier(self, epoch: int) -> None:
        """One batch of the current chat's earlier messages, put above the ones shown; then the next."""
        if epoch != self._fill_epoch or None not in self._bubbles:
            return                                   # another chat is shown now, or this one is whole
        shown = next((b for b in self._bubbles if b is not None), None)
        i = (self._bubbles.index(shown) if shown is not None else len(self._bubbles)) - 1
        until = time.perf_counter() + FILL_SLICE_S
        while i >= self._fill_until:           # a long message may take the slice alone: the window stays live
            after = self._bubbles[i + 1] if i + 1 < len(self._bubbles) else None
            self._bubbles[i] = self._add_bubble(self.current.messages[i], before=self._top_of(after))
            self._show_notes_of(self.current.messages[i], self._bubbles[i])
            i -= 1
            if time.perf_counter() >= until:
                break
        if i >= self._fill_until:
            QTimer.singleShot(0, self.pane, partial(self._fill_earlier, epoch))
        self.pane.view.show_earlier_offer(i + 1 if i < self._fill_until else 0)

    def _show_earlier(self) -> None:
        """The reader asked for the earlier messages: SHOWN_MESSAGES more go on screen, a slice at a time."""
        if None not in self._bubbles:
            return
        self._fill_until = max(0, self._fill_until - SHOWN_MESSAGES)
        self.pane.view.show_earlier_offer(0)
        QTimer.singleShot(0, self.pane, partial(self._fill_earlier, self._fill_epoch))

    def _attach_live(self) -> None:
        """The reply in flight gets the bubble of its message where its chat is now shown (it is the chat's
        last message, always on screen), streaming on from what it has said; elsewhere it has none."""
        live = self.live
        if live is None:
            return
        live.bubble = None
        if live.conversation is not self.current or live.message not in self.current.messages:
            return
        at = next(i for i, m in enumerate(self.current.messages) if m is live.message)
        old = self._bubbles[at]
        if old is None:
            return
        bubble = self._add_bubble(live.message, streaming=True, before=old)
        self.pane.view.remove(old)
        if old in self._notes_above:          # the reply's notes stay above it
            self._notes_above[bubble] = self._notes_above.pop(old)
        self._bubbles[at] = live.bubble = bubble
        bubble.set_stats("" if live.text or live.reasoning else WAITING)

    def _show_reply_notes(self) -> None:
        """The notes of the shown chat's replies, above the replies on screen (an earlier one's as it is
        put on screen, see _fill_earlier)."""
        for msg, bubble in zip(self.current.messages, self._bubbles):
            if bubble is not None:
                self._show_notes_of(msg, bubble)

    def _show_notes_of(self, msg: StoredMessage, bubble: MessageBubble) -> None:
        for m, note in self._reply_notes.get(self.current.id, []):
            if m is msg:
                self._add_note(note, bubble)

    def _add_note(self, note: str, bubble: MessageBubble) -> None:
        """A note just above ``bubble`` (under the notes it has already)."""
        self._notes_above.setdefault(bubble, []).append(self.pane.view.add("notice", note, before=bubble))

    def _drop_notes(self, bubble: MessageBubble) -> None:
        """Take the notes above ``bubble`` off the screen (its reply is asked again, or it is removed)."""
        for note in self._notes_above.pop(bubble, []):
            self.pane.view.remove(note)

    def _top_of(self, bubble: MessageBubble | None) -> MessageBubble | None:
        """``bubble``, or the first of the notes above it: where an earlier message goes."""
        notes = self._notes_above.get(bubble) if bubble is not None else None
        return notes[0] if notes else bubble

    def _add_bubble(self, msg: StoredMessage, streaming: bool = False,
                    before: MessageBubble | None = None) -> MessageBubble:
        bubble = self.pane.view.add(msg.role, msg.content, streaming=streaming, stats=self._line(msg),
                                    reasoning=msg.reasoning, before=before)
        if msg.role == "assistant":
            bubble.set_pager(msg.chosen, len(msg.replies()), enabled=not streaming)
            bubble.page_requested.connect(partial(self.page, bubble))
            bubble.delete_version_requested.connect(partial(self.delete_version, bubble))
        return bubble

    @staticmethod
    def _line(msg: StoredMessage) -> str:
        """The line under a message: its stats, or why it is incomplete."""
        if msg.interrupted:
            return " · ".join(p for p in (INTERRUPTED_NOTE, msg.stats) if p)
        return msg.stats

    def _save(self, conv: Conversation | None = None, touch: bool = True) -> None:
        """Hand the conversation to the writer (returns at once) and show it in the sidebar (``touch``: see
        ConversationLibrary.save)."""
        self.library.save(conv or self.current, touch)
        self._refresh_sidebar()

    def open(self, conv_id: str) -> None:
        """Show a saved conversation (a reply being written goes on in its own chat)."""
        if conv_id == self.current.id:
            self._refresh_sidebar()
            return
        self._show_chat(self.library.find(conv_id) or self.current)

    def new_chat(self) -> None:
        self._show_chat(Conversation(system_prompt=self.pane.settings_box.system_prompt.toPlainText()))

    def _show_chat(self, conv: Conversation) -> None:
        """Show ``conv`` with its own unsent text in the box; the chat left keeps the text it had (a new
        chat never saved is saved now if it has some, so that it can be opened again from the list)."""
        self._keep_edits_now()
        left, text = self.current, self.pane.input.toPlainText()
        self.prefs.set_draft(text, left.id)
        if text.strip() and self.library.find(left.id) is None and all(c.id != left.id for c in self.library.deleted):
            self.library.save(left)
        self._system_edited = False             # the flag was the chat left's
        self.current = conv
        self.prefs.set_current_chat(conv.id)
        self.prefs.sync()                       # a crash after a switch reopens this chat, with the draft left
        self._show_current()
        self._put_draft(self.prefs.draft(conv.id))

    def _put_draft(self, text: str) -> None:
        """A chat's unsent text back in the box, typing going on at its end."""
        self.pane.input.setPlainText(text)
        self.pane.input.moveCursor(QTextCursor.MoveOperation.End)

    # --- edits that are not sent yet -----------------------------------------------------------
    def _system_prompt_edited(self) -> None:
        text = self.pane.settings_box.system_prompt.toPlainText()
        if text != self.current.system_prompt:
            self.current.system_prompt = text
            self._system_edited = True
            self._edited()

    def _edited(self) -> None:
        """A keystroke: the first after a pause is kept at once, the ones that follow within EDITS_SAVE_MS
        (a wait restarted on every keystroke would keep nothing while someone types without pausing)."""
        self.edit_saves.changed()

    def _keep_edits_now(self) -> None:
        """Before another conversation is shown: a system prompt edit still waiting is saved to its own."""
        self.edit_saves.flush()

    def _keep_edits(self) -> None:
        """Remember the unsent text, and save a changed system prompt: a new chat with one written is saved
        from then on, before its first message, so the prompt outlives a quit or a crash."""
        self.prefs.set_draft(self.pane.input.toPlainText(), self.current.id)
        self.prefs.sync()
        problem = self.prefs.problem()
        if problem != self._prefs_problem:
            self._prefs_problem = problem
            self.prefs_error.emit(problem)
        if self._system_edited and (self.current in self.conversations or self.current.system_prompt.strip()):
            self._system_edited = False
            self.library.save(self.current)

    # --- model ---------------------------------------------------------------------------------
    def set_model(self, model: ModelDescription | None) -> None:
        """A model was loaded (or failed to): completion mode when it has no chat template."""
        self.model = model
        if model is None:
            self.pane.mode_label.setText("No model loaded")
        elif model.has_chat_template:
            self.pane.mode_label.setText("Chat mode (the model's chat template)")
        elif model.completion_only:
            self.pane.mode_label.setText("Completion mode: this is a base model, trained on plain text rather "
                                         "than chats, so your text is continued as written")
        else:
            why = "has a broken chat template (see the note)" if model.template_broken else "has no chat template"
            self.pane.mode_label.setText(f"Completion mode: this model {why}, so your text is continued as written")
        if model is not None:
            self.pane.settings_box.set_system_prompt_shown(model.has_chat_template)
            self.pane.settings_box.set_reasoning_shown(model.reasons)
            self._context_total = model.context_tokens
        self._update_buttons()
        self._show_context()

    def _update_buttons(self) -> None:
        self.pane.set_busy(self.live is not None, can_send=self.model is not None,
                           has_turn=self.current.has_user_message)
        self.sidebar.set_busy(self.live.conversation.title if self.live is not None else None,
                              here=self._live_here())

    def _show_context(self) -> None:
        self.pane.set_context(self.current.context_used, self._context_total)

    def on_context(self, usage: ContextUsage) -> None:
        """How much of the context the request in flight takes, and what was dropped to fit it."""
        if self.live is None or usage.request_id != self.live.request_id:
            return
        if usage.context_tokens:
            self._context_total = usage.context_tokens
        self.live.conversation.context_used = usage.prompt_tokens
        if self._live_here():
            self._show_context()
        if usage.note:                   # oldest messages, or the start of a completion prompt, left out
            notes = self._reply_notes.setdefault(self.live.conversation.id, [])
            if not any(m is self.live.message and n == usage.note for m, n in notes):
                notes.append((self.live.message, usage.note))
            if self._live_here():
                self._add_note(usage.note, self.live.bubble)

    def notice(self, text: str) -> None:
        """A line from Strata in the transcript (thermal guard, errors); not saved."""
        self.pane.view.add("notice", text, before=self.live_bubble if self._live_here() else None)

    # --- replies -------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        """Add the user's message and ask for a reply."""
        if self.live is not None or self.model is None:
            return
        if not self.current.messages and self.current.title == Conversation.title:   # not one the user gave
            self.current.title = text.splitlines()[0][:TITLE_CHARS] or "Chat"
        user = StoredMessage("user", text)
        self.current.messages.append(user)
        self._bubbles.append(self._add_bubble(user))
        self.prefs.set_draft("", self.current.id)
        self._reply_to(list(self.current.messages))

    def _reply_to(self, history: list[StoredMessage]) -> None:
        """A new assistant message after ``history``, saved (empty, interrupted) before the first token."""
        msg = StoredMessage("assistant", "", interrupted=True)
        self.current.messages.append(msg)
        bubble = self._add_bubble(msg, streaming=True)
        self._bubbles.append(bubble)
        self._begin(history, msg, bubble)

    def _request(self, request_id: str, history: list[StoredMessage]) -> ReplyRequest:
        self.pane.settings_box.commit()         # a number typed but not entered yet counts
        settings = self.pane.settings_box.settings()
        if not self.model.has_chat_template:
            last_user = next(m.content for m in reversed(history) if m.role == "user")
            return ReplyRequest(request_id, settings, prompt=last_user)
        system = self.current.system_prompt.strip()
        # an empty reply (an error, or a crash before the first token) tells the model nothing; one that only
        # reasoned is a turn of the model's all the same (left out, two user messages would follow each other)
        msgs = ([ChatMessage("system", system)] if system else []) + \
            [ChatMessage(m.role, m.content) for m in history if m.content or m.reasoning or m.role == "user"]
        return ReplyRequest(request_id, settings, messages=tuple(msgs))

    def _begin(self, history: list[StoredMessage], msg: StoredMessage, bubble: MessageBubble) -> None:
        notes = self._reply_notes.get(self.current.id, [])
        notes[:] = [(m, n) for m, n in notes if m is not msg]     # an earlier request's: this one says its own
        self._drop_notes(bubble)
        request = self._request(f"chat-{uuid.uuid4().hex[:10]}", history)
        self.live = _Live(request.request_id, self.current, msg, bubble, request.settings.max_tokens)
        bubble.set_stats(WAITING)
        self._save()
        self._update_buttons()
        self.bridge.submit(request)

    def on_text(self, batch: TextBatch) -> None:
        """Coalesced text from the bridge: shown at once, saved as SavePacer paces it; the context the
        reply takes so far is saved with it, so a restart after a crash counts the reply on the meter."""
        live = self.live
        if live is None:
            return
        grew = False
        for chunk in batch.chunks:
            if chunk.request_id == live.request_id and chunk.used_tokens:
                live.conversation.context_used = chunk.used_tokens    # shown with each save (a new label
                # text can lay the pane out again, which a long chat makes slow: not once a batch)
            if chunk.request_id == live.request_id and (chunk.text or chunk.reasoning):
                if live.bubble is not None and not live.text and not live.reasoning:
                    live.bubble.set_stats("")
                live.text += chunk.text
                live.reasoning += chunk.reasoning
                if live.bubble is not None and chunk.reasoning:
                    live.bubble.reasoning.append(chunk.reasoning)
                if live.bubble is not None and chunk.text:
                    live.bubble.append(chunk.text)
                grew = True
        if grew:
            live.message.set_reply(live.text, "", True, live.reasoning)
            self.stream_saves.changed()

    def _save_live(self) -> None:
        """The streaming reply as far as it is on screen, still marked interrupted."""
        if self.live is not None:
            self.library.save(self.live.conversation)
            if self.live.conversation is self.current:
                self._show_context()

    def on_finished(self, stats: ReplyStats) -> None:
        """A reply ended (finished, max tokens, stopped, error): keep its text and its stats line."""
        live = self.live
        if live is None or stats.request_id != live.request_id:
            return
        self.stream_saves.stop()
        line = stats.summary(live.max_tokens)
        if live.reasoning and not live.text.strip() and stats.completion_tokens:    # it thought, then said nothing
            line += " · no answer: the reply ended in its reasoning"
        live.message.set_reply(live.text, line, False, live.reasoning)
        if live.bubble is not None:
            live.bubble.finish(line)
            live.bubble.set_pager(live.message.chosen, len(live.message.replies()))
        if stats.prompt_tokens or stats.completion_tokens:
            live.conversation.context_used = stats.prompt_tokens + stats.completion_tokens
        self.live = None
        self._save(live.conversation)
        self._update_buttons()
        self._show_context()
        self.reply_done.emit(stats)

    def stop(self) -> None:
        """Stop the reply in flight; what it said so far is kept."""
        if self.live is not None:
            self.bridge.cancel(self.live.request_id)

    def stop_shown(self) -> None:
        """Esc: stop the reply in flight where it is the shown chat's (not one being written out of sight)."""
        if self._live_here():
            self.stop()

    def regenerate(self) -> None:
        """Ask again for the last reply; the earlier replies stay as versions of it."""
        if self.live is not None or self.model is None or not self.current.messages:
            return
        last = self.current.messages[-1]
        if last.role == "user":
            self._reply_to(list(self.current.messages))
            return
        history = self.current.messages[:-1]
        if not any(m.role == "user" for m in history):
            return
        if last.content or last.reasoning:
            last.add_reply(Reply("", "", interrupted=True))
        else:
            last.set_reply("", "", interrupted=True)    # an empty reply holds nothing to keep
        bubble = self._bubbles[-1]
        bubble.show_text("", streaming=True)
        bubble.set_pager(last.chosen, len(last.replies()), enabled=False)
        self._begin(history, last, bubble)

    def page(self, bubble: MessageBubble, step: int) -> None:
        """Show the previous (-1) or next (+1) version of a reply; later turns see the one shown."""
        if self._live_here() or bubble not in self._bubbles:
            return
        msg = self.current.messages[self._bubbles.index(bubble)]
        msg.choose(msg.chosen + step)
        bubble.show_text(msg.content, self._line(msg), reasoning=msg.reasoning)
        bubble.set_pager(msg.chosen, len(msg.replies()))
        self._save(touch=False)                 # the version shown is kept; the chat did not change

    def delete_version(self, bubble: MessageBubble) -> None:
        """Delete the version of a reply that is shown (asks first; the other versions stay)."""
        if self._live_here() or bubble not in self._bubbles:
            return
        msg = self.current.messages[self._bubbles.index(bubble)]
        count = len(msg.replies())
        if count < 2 or not self.confirm("Delete this version?", f"Version {msg.chosen + 1} of {count} of this "
                                         "reply is deleted for good; the other versions stay."):
            return
        msg.delete_chosen()
        bubble.show_text(msg.content, self._line(msg), reasoning=msg.reasoning)
        bubble.set_pager(msg.chosen, len(msg.replies()))
        self._save(touch=False)                 # the version shown is kept; the chat did not change

    def edit_last(self) -> None:
        """Take the last user message back into the input box, removing it and its reply (asks first when
        a reply or unsent text would be lost)."""
        if self.live is not None or not self.current.has_user_message:
            return
        at = max(i for i, m in enumerate(self.current.messages) if m.role == "user")
        lost = sum(1 for m in self.current.messages[at + 1:] for r in m.replies() if r.content or r.reasoning)
        draft = self.pane.input.toPlainText().strip()
        if lost or draft:
            what = "its reply is" if lost == 1 else f"its {lost} replies are"
            question = ("Your last message goes back into the box to be edited"
                        + (f", and {what} removed from the chat for good." if lost else ".")
                        + (" The text now in the box is replaced." if draft else ""))
            if not self.confirm("Edit your last message?", question):
                return
        text = self.current.messages[at].content
        self.prefs.set_draft(text, self.current.id)   # on disk in the box's keeping before it leaves the chat's
        self.prefs.sync()
        del self.current.messages[at:]
        for bubble in self._bubbles[at:]:
            if bubble is not None:
                self._drop_notes(bubble)
                self.pane.view.remove(bubble)
        del self._bubbles[at:]
        notes = self._reply_notes.get(self.current.id, [])
        notes[:] = [(m, n) for m, n in notes if any(m is kept for kept in self.current.messages)]
        self.current.context_used = None          # what the chat now takes is known at its next request
        self.pane.input.setPlainText(text)
        self.pane.input.moveCursor(QTextCursor.MoveOperation.End)      # typing goes on after the text
        self._save()
        self._update_buttons()
        self._show_context()

    # --- the store's answers --------------------------------------------------------------------
    def _report_problems(self, problems: list[str]) -> None:
        """Files the store could not use at start: each in the transcript, the first in the banner."""
        for line in problems:
            self.notice(line)
        if problems:
            more = f" ({len(problems) - 1} more in the chat)" if len(problems) > 1 else ""
            # queued: the window connects store_error after this constructor returns
            QTimer.singleShot(0, self, lambda: self.store_error.emit(problems[0] + more))

    def _on_store_line(self, line: str) -> None:
        self.notice(line or f"Conversations are saved again in {self.store.folder}.")
        self.store_error.emit(line)

    def close(self) -> None:
        """Write what is pending (the reply in flight stays marked interrupted) and stop the writer."""
        self.pane.settings_box.commit()         # a number typed but not entered is kept as the box shows it
        self.stream_saves.stop()
        self._keep_edits_now()
        self.prefs.set_draft(self.pane.input.toPlainText(), self.current.id)
        self.prefs.set_current_chat(self.current.id)
        self.prefs.sync()
        if self.live is not None:
            self.library.save(self.live.conversation)
            if self.live.conversation is self.current:
                self._show_context()
            self.live = None                    # the engine's last word on it comes after: it stays interrupted
        if not self.library.close():
            for path in self.library.writer.rescued:     # the window is closing: the terminal is what is left
                print(f"Strata could not save a chat to {self.library.store.folder}; a copy is in {path}",
                      file=sys.stderr)
