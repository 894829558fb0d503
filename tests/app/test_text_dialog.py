"""The Rename dialog shows a typical chat title whole, all of it selected from the start, so that typing
replaces it and a long title is read from its beginning rather than its end."""
from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QLineEdit, QWidget

from app.dialogs import TEXT_DIALOG_WIDTH, ask_text, text_dialog

LONG_TITLE = "Tell me a very long story about the sea and the ships that sail on it at night"


def test_the_rename_dialog_is_wide_enough_for_the_title_and_opens_at_its_start_all_selected(qtbot):
    dialog = text_dialog(None, "Rename chat", "Title:", LONG_TITLE)
    qtbot.addWidget(dialog)
    dialog.show()
    edit = dialog.findChild(QLineEdit)
    screen = dialog.screen().availableGeometry().width()
    assert min(TEXT_DIALOG_WIDTH, screen) <= dialog.width() <= screen
    assert edit.fontMetrics().horizontalAdvance(LONG_TITLE) < edit.width(), "the whole title is in view"
    assert edit.selectedText() == LONG_TITLE and edit.cursorPosition() == 0


def test_a_short_title_still_gets_a_dialog_of_a_typical_titles_width(qtbot):
    dialog = text_dialog(None, "Rename chat", "Title:", "Chat")
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.width() >= TEXT_DIALOG_WIDTH
    assert dialog.findChild(QLineEdit).selectedText() == "Chat"


def test_typing_in_the_rename_dialog_replaces_the_whole_title(qtbot):
    parent = QWidget()
    qtbot.addWidget(parent)

    def type_and_accept() -> None:
        dialog = QApplication.activeModalWidget()
        QTest.keyClicks(dialog.findChild(QLineEdit), "Sea stories")
        dialog.accept()

    QTimer.singleShot(0, type_and_accept)
    assert ask_text(parent, "Rename chat", "Title:", LONG_TITLE) == "Sea stories"
