"""The chat list from the keyboard: Down in the search box goes to the chats found and Enter opens one, a
chat the search hides is never the one marked, and a Delete shows the chat next to the one deleted with the
keys kept in the list (in the message box once no chat is left)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.conversations import Conversation
from tests.app.chat_fakes import exchange, make_chat

FRUIT = ("Alpha pears", "Beta apples", "Gamma plums")


def _fruit_chats(qtbot, tmp_path):
    """Three chats (newest first in the list: Gamma, Beta, Alpha), Alpha shown, the sidebar's window active."""
    chat = make_chat(qtbot, tmp_path / "c")
    for title in FRUIT:
        chat.new_chat()
        exchange(chat, "Noted.", title)
    ids = {c.title: c.id for c in chat.conversations}
    chat.open(ids["Alpha pears"])
    chat.sidebar.activateWindow()
    qtbot.waitUntil(lambda: chat.sidebar.isActiveWindow())
    return chat, ids


def _marked(chat) -> str | None:
    item = chat.sidebar.list.currentItem()
    return None if item is None else item.data(Qt.ItemDataRole.UserRole)


def test_down_in_the_search_box_goes_to_the_first_chat_found_and_enter_there_opens_it(qtbot, tmp_path):
    chat, ids = _fruit_chats(qtbot, tmp_path)
    chat.sidebar.search.setFocus()
    QTest.keyClicks(chat.sidebar.search, "apples")
    # the search hides Alpha, the chat shown: the list marks the one chat found, and does not open it
    assert chat.sidebar.list.item(2).isHidden() and _marked(chat) == ids["Beta apples"]
    assert chat.current.id == ids["Alpha pears"]
    QTest.keyClick(chat.sidebar.search, Qt.Key.Key_Down)
    assert QApplication.focusWidget() is chat.sidebar.list and _marked(chat) == ids["Beta apples"]
    assert chat.current.id == ids["Alpha pears"]
    QTest.keyClick(chat.sidebar.list, Qt.Key.Key_Return)
    assert chat.current.id == ids["Beta apples"] and chat.pane.view.bubbles[0].text == "Beta apples"
    assert chat.sidebar.delete_button.isEnabled()                    # opened: Delete and Rename act on it


def test_enter_in_the_search_box_opens_the_first_chat_found(qtbot, tmp_path):
    chat, ids = _fruit_chats(qtbot, tmp_path)
    chat.sidebar.search.setFocus()
    QTest.keyClicks(chat.sidebar.search, "PL")                       # "Gamma plums" (and Alpha's "pears": no)
    QTest.keyClick(chat.sidebar.search, Qt.Key.Key_Enter)
    assert chat.current.id == ids["Gamma plums"] and _marked(chat) == ids["Gamma plums"]
    chat.sidebar.search.setText("nothing like this")                 # nothing found: Enter and Down do nothing
    assert _marked(chat) is None
    QTest.keyClick(chat.sidebar.search, Qt.Key.Key_Return)
    QTest.keyClick(chat.sidebar.search, Qt.Key.Key_Down)
    assert chat.current.id == ids["Gamma plums"] and QApplication.focusWidget() is chat.sidebar.search


def test_a_chat_the_search_hides_is_never_marked_and_the_chat_shown_is_marked_again_after_it(qtbot, tmp_path):
    chat, ids = _fruit_chats(qtbot, tmp_path)
    chat.sidebar.search.setText("a")                                 # every title: the chat shown stays marked
    assert _marked(chat) == ids["Alpha pears"]
    chat.sidebar.search.setText("plums")
    assert _marked(chat) == ids["Gamma plums"] and chat.current.id == ids["Alpha pears"]
    # a chat found but not opened is not what Delete and Rename act on
    assert not chat.sidebar.delete_button.isEnabled() and not chat.sidebar.rename_button.isEnabled()
    exchange(chat, "Ripe.", "Pears are in season")                  # the list is filled again: the mark holds
    assert _marked(chat) == ids["Gamma plums"] and chat.conversations[0].id == ids["Alpha pears"]
    chat.sidebar.search.clear()                                      # every chat shown: the one open is marked
    assert _marked(chat) == ids["Alpha pears"] and chat.sidebar.delete_button.isEnabled()
    chat.sidebar.list.setFocus()
    QTest.keyClick(chat.sidebar.list, Qt.Key.Key_Down)               # the arrows open chats, as before
    assert chat.current.id == ids["Gamma plums"]
    chat.new_chat()                                                  # a chat not in the list: none is marked
    assert _marked(chat) is None
    chat.sidebar.search.setText("apples")
    assert _marked(chat) == ids["Beta apples"]
    chat.sidebar.search.clear()
    assert _marked(chat) is None and chat.current.id not in ids.values()


def _titled_chats(window, titles):
    chat = window.chat
    for title in titles:
        conv = Conversation(title=title)
        chat.library.save(conv)
    chat._refresh_sidebar()
    return chat, {c.title: c.id for c in chat.conversations}


def test_the_delete_key_shows_the_chat_below_the_one_deleted_else_the_one_above_and_the_keys_stay(window, qtbot):
    chat, ids = _titled_chats(window, ["One", "Two", "Three", "Four"])          # listed Four, Three, Two, One
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    listed = lambda: [chat.sidebar.list.item(i).data(Qt.ItemDataRole.UserRole)   # noqa: E731
                      for i in range(chat.sidebar.list.count())]
    assert listed()[:4] == [ids["Four"], ids["Three"], ids["Two"], ids["One"]]
    chat.open(ids["Three"])
    chat.sidebar.list.setFocus()
    QTest.keyClick(chat.sidebar.list, Qt.Key.Key_Delete)             # in the middle: the one below it
    assert chat.current.id == ids["Two"] and _marked(chat) == ids["Two"]
    assert QApplication.focusWidget() is chat.sidebar.list
    chat.open(ids["One"])
    QTest.keyClick(chat.sidebar.list, Qt.Key.Key_Delete)             # at the bottom: the one above it
    assert chat.current.id == ids["Two"] and QApplication.focusWidget() is chat.sidebar.list
    chat.sidebar.search.setText("our")                               # the one below it found by the search
    chat.open(ids["Four"])
    chat.sidebar.delete_button.setFocus()                            # the button: the keys go back to the list
    QTest.keyClick(chat.sidebar.delete_button, Qt.Key.Key_Space)
    assert chat.library.find(ids["Four"]) is None
    assert QApplication.focusWidget() is chat.sidebar.list


def test_deleting_the_last_chat_puts_the_keys_in_the_message_box(window, qtbot):
    chat, ids = _titled_chats(window, ["Only"])
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    chat.open(ids["Only"])
    for conv in list(chat.conversations):
        if conv.id != ids["Only"]:
            chat.delete(conv.id)
    chat.sidebar.list.setFocus()
    QTest.keyClick(chat.sidebar.list, Qt.Key.Key_Delete)
    assert chat.conversations == [] and chat.sidebar.list.count() == 0
    assert QApplication.focusWidget() is window.chat_pane.input
    assert chat.sidebar.undo_bar.isVisibleTo(chat.sidebar)


def test_ctrl_f_puts_the_typing_in_the_search_box(window, qtbot):
    window.show()
    window.sidebar.search.setText("old words")
    window.activateWindow()
    QTest.keyClick(window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.sidebar.search.hasFocus(), timeout=2000)
    assert window.sidebar.search.selectedText() == "old words"          # typing replaces the last search


def test_esc_in_the_search_box_clears_the_search_and_then_is_the_window_s_again(window, qtbot):
    stopped = []
    window.chat.stop_shown = lambda: stopped.append(True)       # what Chat › Stop the reply (Esc) does
    window.show()
    window.activateWindow()
    search = window.sidebar.search
    search.setFocus()
    qtbot.waitUntil(search.hasFocus, timeout=2000)
    QTest.keyClicks(search, "words")
    QTest.keyClick(search, Qt.Key.Key_Escape)
    assert search.text() == "" and stopped == []
    QTest.keyClick(search, Qt.Key.Key_Escape)                   # nothing left to clear: the shortcut's
    assert stopped == [True]
