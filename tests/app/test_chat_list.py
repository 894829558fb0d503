"""The conversation list: a renamed chat keeps its place and its title, a long title fits one line, paging
through versions does not reorder the list, the search finds a chat by its title or any reply, the trash
gives a deleted chat back, a restart (or a crash) opens the chat shown last, and other chats open while a
reply is being written in one."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.conversation_list import DETAIL, WRITING
from app.messages import ContextUsage
from tests.app.chat_fakes import bubble_texts, exchange, finish, make_chat, on_disk, stream


def test_a_chat_can_be_renamed_and_keeps_its_place_and_title_across_restarts(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("A first question about tides")
    finish(chat)
    chat.new_chat()
    chat.send("Second chat")
    finish(chat)
    first = next(c for c in chat.conversations if c.title.startswith("A first"))
    order = [c.id for c in chat.conversations]
    asked = []
    chat.ask_text = lambda title, label, text: asked.append(text) or "  Tides\n notes  "
    chat.sidebar.list.setCurrentRow(order.index(first.id))          # opens it, as a click does
    chat.sidebar.rename_button.click()
    assert asked == ["A first question about tides"]                  # the box starts from the title
    assert first.title == "Tides notes" and [c.id for c in chat.conversations] == order   # one line; same place
    assert on_disk(chat, first.id)["title"] == "Tides notes"
    item = chat.sidebar.list.item(order.index(first.id))
    assert item.toolTip() == "Tides notes" and item.text().startswith("Tides notes\n")
    chat.ask_text = lambda title, label, text: None                   # Cancel: nothing changes
    chat.sidebar.rename_button.click()
    chat.ask_text = lambda title, label, text: "   "                  # an empty title: nothing changes
    chat.sidebar.rename_button.click()
    assert first.title == "Tides notes"
    again = make_chat(qtbot, tmp_path / "c")
    assert "Tides notes" in [c.title for c in again.conversations]


def test_a_chat_renamed_before_its_first_message_keeps_its_name(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.library.save(chat.current)                    # a new chat in the list (a draft kept it there)
    chat._refresh_sidebar()
    chat.ask_text = lambda title, label, text: "Trip plans"
    chat.sidebar.list.setCurrentRow(0)
    chat.sidebar.rename_button.click()
    chat.send("Where should we go in May?")
    assert chat.current.title == "Trip plans"


def test_a_long_title_is_cut_to_one_line_and_the_entry_keeps_its_time(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Hello there, tell me a story about " + "a very long winding road " * 4)
    finish(chat)
    chat.sidebar.resize(chat.sidebar.minimumWidth(), 400)           # the narrowest sidebar
    QApplication.processEvents()
    item = chat.sidebar.list.item(0)
    title, detail = item.text().split("\n")
    assert title.endswith("…") and "messages" in detail and " · 2 messages" in detail
    assert item.toolTip() == chat.current.title
    metrics = chat.sidebar.list.fontMetrics()
    assert metrics.horizontalAdvance(title) <= chat.sidebar.list.viewport().width()


def test_paging_through_versions_does_not_move_the_chat_up_the_list(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "first", question="Older chat")
    older = chat.current
    chat.regenerate()
    stream(chat, "second")
    finish(chat)
    chat.new_chat()
    exchange(chat, "x", question="Newer chat")
    chat.open(older.id)
    before = older.updated
    chat.page(chat._bubbles[-1], -1)
    assert older.updated == before and chat.conversations.index(older) > 0
    assert on_disk(chat, older.id)["messages"][-1]["content"] == "first"


def test_the_search_box_shows_the_chats_whose_title_or_messages_hold_the_text(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("How do tides work?")
    finish(chat)
    chat.new_chat()
    chat.send("A recipe for bread")
    finish(chat)
    bread = chat.current.id
    chat.ask_text = lambda *_a: "Baking"
    chat.rename(bread)
    listed = lambda: [chat.sidebar.list.item(i).data(Qt.ItemDataRole.UserRole)   # noqa: E731
                      for i in range(chat.sidebar.list.count()) if not chat.sidebar.list.item(i).isHidden()]
    assert len(listed()) == 2
    QTest.keyClicks(chat.sidebar.search, "TIDES")              # a message's text, case ignored
    assert len(listed()) == 1 and listed() != [bread]
    chat.sidebar.search.setText("bak")                         # a title
    assert listed() == [bread]
    chat.sidebar.search.setText("nothing like this")
    assert listed() == [] and chat.sidebar.no_match.isVisibleTo(chat.sidebar)
    chat.send("More bread, please")                            # the list is filled again: the search holds
    finish(chat)
    assert listed() == [] and chat.sidebar.list.count() == 2
    chat.sidebar.search.clear()
    assert len(listed()) == 2 and not chat.sidebar.no_match.isVisibleTo(chat.sidebar)
    # while the search hides the open chat, Delete, Rename and F2 have nothing to act on
    assert chat.current.id == bread and chat.sidebar.delete_button.isEnabled()
    chat.sidebar.search.setText("tides")
    assert bread not in listed()
    assert not chat.sidebar.delete_button.isEnabled() and not chat.sidebar.rename_button.isEnabled()
    chat.sidebar._delete()
    chat.sidebar._rename()
    assert bread in [c.id for c in chat.library.conversations] and chat.current.title == "Baking"
    chat.sidebar.search.clear()
    assert chat.sidebar.delete_button.isEnabled()


def test_the_search_finds_a_reply_version_that_is_not_shown(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Name a colour")
    stream(chat, "zanzibar red")
    finish(chat)
    chat.regenerate()
    stream(chat, "blue")
    finish(chat)
    assert [r.content for r in chat.current.messages[-1].replies()] == ["zanzibar red", "blue"]
    chat.sidebar.search.setText("zanzibar")                  # only the version not shown holds it
    assert not chat.sidebar.list.item(0).isHidden()


def test_the_search_finds_words_as_the_chat_shows_them_and_as_written(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Format it")
    stream(chat, "the **second** *line* and `snake_case`")
    finish(chat)
    for words in ("second line", "**second**", "snake_case", "snakecase"):
        chat.sidebar.search.setText(words)
        assert not chat.sidebar.list.item(0).isHidden(), words
    chat.sidebar.search.setText("third line")
    assert chat.sidebar.list.item(0).isHidden()


def test_a_deleted_chat_comes_back_from_the_trash_after_its_undo_is_gone(qtbot, tmp_path):
    from app.trash_dialog import TrashDialog
    folder = tmp_path / "c"
    chat = make_chat(qtbot, folder)
    chat.send("Keep me for later")
    finish(chat)
    gone = chat.current.id
    chat.new_chat()
    chat.send("Another chat")
    finish(chat)
    chat.delete(gone)
    chat.sidebar.show_undo("")                    # the Undo offer is over (its time ran out, or a restart)
    chat.library.flush(10)
    assert not (folder / f"{gone}.json").exists() and (folder / "trash" / f"{gone}.json").is_file()
    dialog = TrashDialog(chat.trashed, chat.restore, str(chat.store.trash_folder))
    qtbot.addWidget(dialog)
    assert dialog.list.count() == 1 and dialog.list.item(0).text().startswith("Keep me for later")
    chat.send("While a reply streams")
    writing = chat.current.id
    stream(chat, "Half")
    dialog.restore_button.click()                 # the reply goes on in its own chat
    assert dialog.list.count() == 0 and dialog.empty.isVisibleTo(dialog) and not dialog.restore_button.isEnabled()
    assert chat.current.id == gone and "Keep me for later" in bubble_texts(chat)
    stream(chat, " and the rest.")
    finish(chat)
    assert on_disk(chat, writing)["messages"][-1]["content"] == "Half and the rest."
    chat.library.flush(10)
    assert (folder / f"{gone}.json").is_file() and not (folder / "trash" / f"{gone}.json").exists()
    again = make_chat(qtbot, folder)              # in the list after a restart too
    assert gone in [c.id for c in again.conversations] and again.trashed() == []


def test_the_chat_switched_to_is_on_disk_at_once_so_a_crash_reopens_it(qtbot, tmp_path):
    # a crash (no close) after switching chats: the settings file already names the chat shown
    ini = tmp_path / "strata.ini"
    chat = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    chat.send("first chat")
    finish(chat)
    first = chat.current.id
    chat.new_chat()
    chat.send("second chat")
    finish(chat)
    chat.open(first)
    assert f"current={first}" in ini.read_text()        # the file itself: Qt shares unsynced values in-process


def test_a_restart_reopens_the_chat_shown_last_not_the_newest(qtbot, tmp_path):
    # the user went back to an older chat: after a quit (or a crash, the switch is written at once) it is
    # that chat that opens again, though another was updated later
    ini, folder = tmp_path / "strata.ini", tmp_path / "c"
    first = make_chat(qtbot, folder, settings_file=ini)
    first.send("Older chat")
    finish(first)
    older = first.current.id
    first.new_chat()
    first.send("Newer chat")
    finish(first)
    first.open(older)
    assert first.conversations[0].id != older            # the newest is the other one
    first.close()
    again = make_chat(qtbot, folder, settings_file=ini)
    assert again.current.id == older and "Older chat" in bubble_texts(again)


def _writing_elsewhere(qtbot, tmp_path):
    """A chat with a reply being written in "Story" while another chat, "Other", is shown: (chat, the id of
    the one being written in, the id of the one shown)."""
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "A.", "Other")
    other = chat.current.id
    chat.new_chat()
    chat.send("Story")
    writing = chat.current.id
    chat.open(other)
    return chat, writing, other


# --- other chats while a reply is being written ----------------------------------------------------------
def test_a_reply_goes_on_in_its_own_chat_while_another_is_open_and_is_there_when_it_comes_back(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "An older answer.", "Older question")
    older = chat.current.id
    chat.new_chat()
    chat.send("Tell me a story")
    writing = chat.current.id
    stream(chat, "Once upon")
    chat.open(older)                                   # allowed: the reply goes on where it was asked
    assert chat.current.id == older and bubble_texts(chat) == ["Older question", "An older answer."]
    assert chat.live is not None and chat.live_bubble is None
    item = next(chat.sidebar.list.item(i) for i in range(chat.sidebar.list.count())
                if chat.sidebar.list.item(i).data(Qt.ItemDataRole.UserRole) == writing)
    assert item.data(DETAIL) == WRITING                # the list says where it is being written
    assert "Tell me a story" in chat.sidebar.busy_note.text() and chat.sidebar.busy_note.isVisibleTo(chat.sidebar)
    assert not chat.pane.send_button.isEnabled() and chat.pane.stop_button.isEnabled()
    stream(chat, " a time")
    chat.stream_saves.timer.timeout.emit()
    assert on_disk(chat, writing)["messages"][-1]["content"] == "Once upon a time"   # on disk while away
    assert bubble_texts(chat) == ["Older question", "An older answer."], "not written into the chat shown"
    chat.open(writing)
    bubble = chat.live_bubble
    assert bubble is chat.pane.view.bubbles[-1] and bubble.text == "Once upon a time" and bubble.streaming
    stream(chat, ", there was.")
    finish(chat)
    assert bubble.text == "Once upon a time, there was." and "finished" in bubble.stats.text()
    reply = on_disk(chat, writing)["messages"][-1]
    assert reply["content"] == "Once upon a time, there was." and reply["interrupted"] is False
    assert item.data(DETAIL) != WRITING and chat.sidebar.busy_note.isHidden()


def test_a_reply_that_ends_while_its_chat_is_not_shown_is_whole_when_it_is_opened(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("First chat")
    writing = chat.current.id
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100, dropped_messages=1, note="1 earlier message left out"))
    chat.new_chat()                                    # Ctrl+N works too
    assert chat.current.id != writing and "1 earlier message left out" not in bubble_texts(chat)
    chat.send("Not yet")                               # one reply at a time: Send waits, nothing is lost
    assert len(chat.bridge.requests) == 1 and chat.current.messages == []
    stream(chat, "All of it.")
    finish(chat)
    assert chat.pane.send_button.isEnabled()
    chat.open(writing)
    assert bubble_texts(chat) == ["First chat", "1 earlier message left out", "All of it."]
    assert "finished" in chat.pane.view.bubbles[-1].stats.text()


def test_a_chat_a_reply_is_being_written_in_cannot_be_deleted_but_the_others_can(qtbot, tmp_path):
    folder = tmp_path / "c"
    chat = make_chat(qtbot, folder)
    exchange(chat, "Old.", "Delete me")
    other = chat.current.id
    chat.new_chat()
    chat.send("Keep writing")
    writing = chat.current.id
    stream(chat, "Still")
    chat.delete(writing)
    assert chat.library.find(writing) is not None and chat.live is not None
    chat.delete(other)                                 # another chat: gone to the trash, Undo offered
    assert chat.library.find(other) is None and chat.current.id == writing
    chat.open(writing)
    stream(chat, " here.")
    chat.undo_delete()
    assert chat.current.id == other and chat.live is not None
    finish(chat)
    assert on_disk(chat, writing)["messages"][-1]["content"] == "Still here."


def test_a_crash_while_another_chat_is_shown_keeps_the_reply_as_far_as_it_was_saved(qtbot, tmp_path):
    folder = tmp_path / "c"
    first = make_chat(qtbot, folder)
    first.send("Genesis")
    writing = first.current.id
    stream(first, "In the beginning")
    first.new_chat()
    stream(first, " God created")
    first.stream_saves.timer.timeout.emit()
    assert first.library.flush(10)
    again = make_chat(qtbot, folder)                   # no close: the process died
    again.open(writing)
    assert again.pane.view.bubbles[-1].text == "In the beginning God created"
    assert "interrupted" in again.pane.view.bubbles[-1].stats.text()


def test_the_delete_key_in_the_list_deletes_the_chat_selected_with_undo(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "Gone soon.", "Delete me by key")
    gone = chat.current.id
    chat.new_chat()
    exchange(chat, "Stays.", "Keep me")
    chat.open(gone)
    chat.sidebar.list.setFocus()
    QTest.keyClick(chat.sidebar.list, Qt.Key.Key_Delete)
    assert chat.library.find(gone) is None and chat.sidebar.undo_bar.isVisibleTo(chat.sidebar)
    chat.sidebar.undo_button.click()
    assert chat.current.id == gone


def test_a_held_delete_key_deletes_one_chat_not_the_list(qtbot, tmp_path):
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QKeyEvent
    chat = make_chat(qtbot, tmp_path / "c")
    for i in range(3):
        chat.new_chat()
        exchange(chat, "x", f"Chat {i}")
    press = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_Delete, Qt.KeyboardModifier.NoModifier)
    again = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_Delete, Qt.KeyboardModifier.NoModifier, "", True)   # repeat
    for event in (press, again, again):
        QApplication.sendEvent(chat.sidebar.list, event)
    assert len(chat.conversations) == 2


def test_the_line_over_the_list_names_the_chat_being_written_in_after_a_rename(qtbot, tmp_path):
    chat, writing, other = _writing_elsewhere(qtbot, tmp_path)
    chat.ask_text = lambda *_args: "Renamed title"
    chat.rename(writing)
    assert "“Renamed title”" in chat.sidebar.busy_note.text()


def test_a_regenerated_reply_shows_only_its_own_notes(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Q1")
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100, dropped_messages=1, note="dropped the oldest message"))
    stream(chat, "B.")
    finish(chat)
    chat.regenerate()
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100, dropped_messages=2, note="dropped the 2 oldest"))
    assert bubble_texts(chat).count("dropped the 2 oldest") == 1
    finish(chat)
    chat.regenerate()
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100))           # nothing dropped this time
    finish(chat)
    shown = chat.current.id
    chat.new_chat()
    chat.open(shown)
    assert not any("dropped" in t for t in bubble_texts(chat))


def test_esc_stops_the_reply_of_the_chat_shown_not_one_out_of_sight(qtbot, tmp_path):
    chat, writing, other = _writing_elsewhere(qtbot, tmp_path)
    chat.stop_shown()
    assert chat.bridge.cancelled == []
    chat.pane.stop_button.click()                     # the button says what it does: it stops it
    assert chat.bridge.cancelled == [chat.live_id]
    chat.open(writing)
    chat.stop_shown()
    assert chat.bridge.cancelled == [chat.live_id] * 2


def test_a_note_of_an_early_reply_comes_back_above_it_when_a_long_chat_opens(qtbot, tmp_path):
    from app.chat_controller import SHOWN_AT_ONCE
    chat = make_chat(qtbot, tmp_path / "c")
    for i in range(SHOWN_AT_ONCE):
        chat.send(f"Q{i}")
        if i in (1, 2):
            chat.on_context(ContextUsage(chat.live_id, 300, 512, 100, dropped_messages=1, note=f"note of A{i}"))
        stream(chat, f"A{i}")
        finish(chat)
    shown = chat.current.id
    chat.new_chat()
    chat.open(shown)                                   # the last 12 now, the earlier ones a slice at a time
    qtbot.waitUntil(lambda: None not in chat._bubbles, timeout=5000)
    texts = bubble_texts(chat)
    assert texts[texts.index("A1") - 1] == "note of A1" and texts[texts.index("A2") - 1] == "note of A2"
    assert texts[texts.index("note of A1") - 1] == "Q1" and texts.count("note of A1") == 1


def test_an_entrys_second_line_is_the_longest_form_that_fits_the_sidebar(qapp):
    # at the default width "07 Dec 06:13 · 2 messages" was cut to "07 Dec 06:13 · 2 messa…"
    import time

    from PySide6.QtGui import QFontMetrics
    from app.conversation_list import detail_lines, fitting
    now = time.mktime((2026, 12, 7, 18, 0, 0, 0, 0, -1))
    today, earlier = now - 3600, now - 3 * 86400
    assert detail_lines(today, 2, now).split("\n") == ["07 Dec 17:00 · 2 messages", "17:00 · 2 messages",
                                                        "17:00 · 2"]
    assert detail_lines(earlier, 1, now).split("\n")[1:] == ["04 Dec · 1 message", "04 Dec · 1"]
    metrics = QFontMetrics(qapp.font())
    forms = detail_lines(today, 2, now).split("\n")
    for form in forms:
        assert fitting(metrics, detail_lines(today, 2, now), metrics.horizontalAdvance(form)) == form
    cut = fitting(metrics, detail_lines(today, 2, now), metrics.horizontalAdvance(forms[-1]) - 4)
    assert cut.endswith("…")


def test_the_trash_cuts_a_long_title_to_the_dialogs_width(qtbot):
    # its rows scrolled sideways to show the whole title
    from app.conversations import Conversation, StoredMessage
    from app.trash_dialog import TrashDialog
    chat = Conversation(messages=[StoredMessage("user", "hi")])
    chat.title = "A very long renamed title " * 6
    dialog = TrashDialog(lambda: [chat], lambda _id: None, "/somewhere/trash")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(dialog.list.isVisible)
    assert not dialog.list.horizontalScrollBar().isVisible() and dialog.list.item(0).toolTip() == chat.title


def test_an_open_list_of_deleted_chats_follows_deletes_and_undo(qtbot, tmp_path):
    from app.trash_dialog import TrashDialog
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "A.", "first")
    chat.new_chat()
    exchange(chat, "B.", "second")
    dialog = TrashDialog(chat.trashed, chat.restore, "/trash", changed=chat.sidebar.trash_changed)
    qtbot.addWidget(dialog)
    ids = lambda: [dialog.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(dialog.list.count())]  # noqa
    assert ids() == []
    gone = chat.conversations[-1].id
    chat.delete(gone)
    assert ids() == [gone]
    chat.undo_delete()                       # Undo under the chat list: that chat is no longer in the trash
    assert ids() == [] and dialog.empty.isVisibleTo(dialog)
