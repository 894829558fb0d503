"""The questions the chat asks the user: a Yes/Cancel question and one line of text (tests replace them)."""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QInputDialog, QMessageBox, QWidget

Confirm = Callable[[str, str], bool]     # (title, question) -> the user said yes
AskText = Callable[[str, str, str], str | None]   # (title, label, text) -> the text entered, None: cancelled


def ask(parent: QWidget, title: str, question: str) -> bool:
    """A Yes/Cancel question; Cancel is the default."""
    yes, cancel = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.Cancel
    return QMessageBox.question(parent, title, question, yes | cancel, cancel) == yes


def ask_text(parent: QWidget, title: str, label: str, text: str) -> str | None:
    """One line of text, ``text`` to begin with; None when cancelled."""
    got, ok = QInputDialog.getText(parent, title, label, text=text)
    return got if ok else None
