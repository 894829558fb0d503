"""The child process of test_chat_crash: a chat on real widgets and a real store shows the first text of a
reply, takes a paste into its input box while the reply goes on, says READY, and runs until it is killed.

    python -m tests.app.kill_mid_reply CONVERSATIONS_FOLDER SETTINGS_FILE
"""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from app.chat_controller import ChatController
from app.chat_pane import ChatPane
from app.conversation_list import ConversationList
from app.conversations import ConversationStore
from tests.app.chat_fakes import CHAT_MODEL, SEEN, FakeBridge, stream

QUESTION = "Tell me a very long story about the sea"
FIRST_TEXT = (SEEN + " ") * 7            # the first batch of a reply: about the 388 characters of a trial
DRAFT = "my next question is about"


def main(folder: str, settings_file: str) -> None:
    app = QApplication([])
    settings = QSettings(settings_file, QSettings.Format.IniFormat)
    pane, sidebar = ChatPane(), ConversationList()
    chat = ChatController(pane, sidebar, ConversationStore(Path(folder)), FakeBridge(), settings)
    pane.show()
    sidebar.show()
    chat.set_model(CHAT_MODEL)
    chat.send(QUESTION)
    stream(chat, FIRST_TEXT)
    pane.input.insertPlainText(DRAFT)
    # what the chat handed to the store's writer thread is on disk; what it still holds back, a kill loses
    chat.library.flush(10)
    print("READY", flush=True)
    app.exec()                           # the reply is still streaming when the kill comes


if __name__ == "__main__":
    main(*sys.argv[1:3])
