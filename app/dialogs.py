"""The questions the chat asks the user: a Yes/Cancel question and one line of text (tests replace them)."""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QApplication, QInputDialog, QLineEdit, QMessageBox, QWidget

Confirm = Callable[[str, str], bool]     # (title, question) -> the user said yes
AskText = Callable[[str, str, str], str | None]   # (title, label, text) -> the text entered, None: cancelled
TEXT_DIALOG_WIDTH = 420   # wide enough for a typical chat title; a longer text widens it, up to the screen


def ask(parent: QWidget, title: str, question: str) -> bool:
    """A Yes/Cancel question; Cancel is the default."""
    yes, cancel = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.Cancel
    return QMessageBox.question(parent, title, question, yes | cancel, cancel) == yes


class _TextDialog(QInputDialog):
    """A one-line text dialog that opens with its text selected from the end back to the start, so that the
    start of a text longer than the field is in view (QInputDialog selects it forwards when shown)."""

    def setVisible(self, visible: bool) -> None:
        super().setVisible(visible)
        edit = self.findChild(QLineEdit)
        if visible and edit is not None:
            edit.setSelection(len(edit.text()), -len(edit.text()))


def text_dialog(parent: QWidget | None, title: str, label: str, text: str) -> QInputDialog:
    """The dialog of ``ask_text``: wide enough to show ``text`` whole where the screen allows, with all of it
    selected (typing replaces it) and its start in view."""
    dialog = _TextDialog(parent)
    dialog.setWindowTitle(title)
    dialog.setLabelText(label)
    dialog.setTextValue(text)
    edit = dialog.findChild(QLineEdit)
    screen = (parent.screen() if parent is not None else None) or QApplication.primaryScreen()
    most = int(screen.availableGeometry().width() * 0.9) if screen is not None else TEXT_DIALOG_WIDTH
    # the text's width, with room for the line edit's frame and the dialog's margins
    wanted = edit.fontMetrics().horizontalAdvance(text) + 4 * edit.fontMetrics().averageCharWidth() + 48
    dialog.resize(max(min(max(TEXT_DIALOG_WIDTH, wanted), most), dialog.minimumSizeHint().width()),
                  dialog.sizeHint().height())
    return dialog


def ask_text(parent: QWidget, title: str, label: str, text: str) -> str | None:
    """One line of text, ``text`` to begin with; None when cancelled."""
    dialog = text_dialog(parent, title, label, text)
    ok = dialog.exec() == QInputDialog.DialogCode.Accepted
    got = dialog.textValue()
    dialog.deleteLater()
    return got if ok else None
