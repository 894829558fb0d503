"""A chat controller on real widgets and a real store, with a bridge that only records what it is asked.

For the chat's own logic (saving, versions, undo, keys, settings) no engine is needed: the tests play the
bridge's part by calling ``on_context``, ``on_text`` and ``on_finished`` as the real bridge does.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings

from app.chat_controller import ChatController
from app.chat_pane import ChatPane
from app.conversation_list import ConversationList
from app.conversations import ConversationStore
from app.messages import ModelDescription, ReplyRequest, ReplyStats, TextBatch, TextChunk

CHAT_MODEL = ModelDescription(name="tiny", path="/models/tiny", family="qwen3_moe", device="cpu", num_layers=2,
                              num_experts=4, top_k=2, params=1000, is_demo=False, random_weights=False,
                              has_chat_template=True, context_tokens=512)
COMPLETION_MODEL = replace(CHAT_MODEL, has_chat_template=False)
#: A reply's text, for the tests that stream it in pieces.
SEEN = "In the beginning God created the heaven and the earth."


class FakeBridge:
    def __init__(self) -> None:
        self.requests: list[ReplyRequest] = []
        self.cancelled: list[str] = []

    def submit(self, request: ReplyRequest) -> None:
        self.requests.append(request)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def make_chat(qtbot, folder: Path, settings_file: Path | None = None,
              model: ModelDescription | None = CHAT_MODEL) -> ChatController:
    """A controller over ``folder`` (as a fresh start of the app would make it), its widgets shown."""
    pane, sidebar = ChatPane(), ConversationList()
    qtbot.addWidget(pane)
    qtbot.addWidget(sidebar)
    settings = QSettings(str(settings_file), QSettings.Format.IniFormat) if settings_file else None
    chat = ChatController(pane, sidebar, ConversationStore(folder), FakeBridge(), settings)
    chat.confirm = lambda _title, _question: True
    pane.show()
    sidebar.show()
    if model is not None:
        chat.set_model(model)
    return chat


def stream(chat: ChatController, text: str, used_tokens: int = 0) -> None:
    """``text`` arrives for the reply in flight; ``used_tokens``: its prompt and reply so far (0: not said)."""
    chat.on_text(TextBatch((TextChunk(chat.live_id, text, used_tokens=used_tokens),)))


def finish(chat: ChatController, reason: str = "stop", prompt_tokens: int = 30, completion_tokens: int = 5,
           error: str | None = None) -> ReplyStats:
    stats = ReplyStats(chat.live_id, "chat", reason, prompt_tokens=prompt_tokens,
                       completion_tokens=completion_tokens, ttft_ms=12.0, decode_tok_s=50.0, error=error)
    chat.on_finished(stats)
    return stats


def exchange(chat: ChatController, text: str, question: str = "Tell me") -> None:
    """The user sends ``question`` and the reply ``text`` streams in and finishes."""
    chat.send(question)
    stream(chat, text)
    finish(chat)


def on_disk(chat: ChatController, conv_id: str | None = None) -> dict:
    """The current conversation's file as it is on disk once the writer has caught up."""
    assert chat.library.flush(10)
    path = chat.store.path_of(conv_id or chat.current.id)
    return json.loads(path.read_text(encoding="utf-8"))


def bubble_texts(chat: ChatController) -> list[str]:
    """Every bubble's text, notices included, top to bottom."""
    return [b.text for b in chat.pane.view.bubbles]


def message_texts(chat: ChatController) -> list[str]:
    """The user's and the model's bubbles only."""
    return [b.text for b in chat.pane.view.bubbles if b.role != "notice"]
