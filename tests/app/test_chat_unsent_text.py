"""Unsent text survives: what is typed in the box is kept with its own chat through switches, restarts and
crashes, also when the chat's file is damaged or cannot be read for now, and so is a system prompt written
before a first message. A recording bridge stands in for the engine (see chat_fakes)."""
from __future__ import annotations

import errno
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtTest import QTest

from tests.app.chat_fakes import bubble_texts, exchange, finish, make_chat, on_disk


def test_unsent_text_is_kept_across_a_restart(qtbot, tmp_path):
    ini = tmp_path / "strata.ini"
    first = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    QTest.keyClicks(first.pane.input, "a long prompt I have not sent yet")
    assert first.edit_saves.timer.isActive() and first.edit_saves.timer.interval() <= 1000
    first.edit_saves.timer.timeout.emit()
    first.prefs.settings.sync()
    second = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert second.pane.input.toPlainText() == "a long prompt I have not sent yet"
    second.pane.send_button.click()
    second.prefs.settings.sync()
    third = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert third.pane.input.toPlainText() == "", "a sent message is not offered again"
    QTest.keyClicks(third.pane.input, "typed just before quitting")
    third.close()                           # closing the window keeps it too, with no timer left to fire
    fourth = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert fourth.pane.input.toPlainText() == "typed just before quitting"


def test_each_chat_keeps_its_own_unsent_text_through_switches_and_restarts(qtbot, tmp_path):
    # Text typed in one chat stays with that chat: another chat shows its own (or an empty box), and
    # going back brings it back; so does a restart, for the chat shown and the one opened after.
    ini = tmp_path / "strata.ini"
    first = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    first.send("Hello")
    finish(first)
    a = first.current.id
    QTest.keyClicks(first.pane.input, "half a question for A")
    first.new_chat()
    assert first.pane.input.toPlainText() == ""
    first.send("Hi")
    finish(first)
    b = first.current.id
    QTest.keyClicks(first.pane.input, "a thought for B")
    first.open(a)
    assert first.pane.input.toPlainText() == "half a question for A"
    first.open(b)
    assert first.pane.input.toPlainText() == "a thought for B"
    QTest.keyClicks(first.pane.input, ", and more")      # typing goes on at the end of the text kept
    assert first.pane.input.toPlainText() == "a thought for B, and more"
    first.close()
    again = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert again.current.id == b and again.pane.input.toPlainText() == "a thought for B, and more"
    QTest.keyClicks(again.pane.input, "!")
    assert again.pane.input.toPlainText() == "a thought for B, and more!"
    again.open(a)
    assert again.pane.input.toPlainText() == "half a question for A"
    again.pane.send_button.click()                      # sent: A's box is empty from now on
    finish(again)
    again.open(b)
    again.open(a)
    assert again.pane.input.toPlainText() == ""


def test_a_new_chat_left_with_unsent_text_is_kept_in_the_list_with_it(qtbot, tmp_path):
    # Text typed into a new chat that was never sent: leaving it (New chat again, or another chat)
    # saves the chat, so it is in the list and opens again with its text, after a restart too.
    ini = tmp_path / "strata.ini"
    chat = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    QTest.keyClicks(chat.pane.input, "an idea for later")
    idea = chat.current.id
    chat.new_chat()
    assert chat.pane.input.toPlainText() == "" and chat.library.find(idea) is not None
    chat.new_chat()                                     # an empty new chat left behind is not kept
    assert len(chat.conversations) == 1
    chat.close()
    again = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    again.open(idea)
    assert again.current.id == idea and again.pane.input.toPlainText() == "an idea for later"


def _chat_with_unsent_text(qtbot, tmp_path):
    """A chat "A" with one reply and unsent text in its box: (settings file, folder, the chat, A's id)."""
    ini, folder = tmp_path / "strata.ini", tmp_path / "c"
    first = make_chat(qtbot, folder, settings_file=ini)
    first.send("Chat A")
    finish(first)
    QTest.keyClicks(first.pane.input, "half a question for A")
    return ini, folder, first, first.current.id


def test_the_unsent_text_of_a_chat_whose_file_was_set_aside_is_kept_in_a_chat_of_its_own(qtbot, tmp_path):
    # Chat A's file is damaged while A holds unsent text: the file is set aside, and the text comes back
    # in a chat of its own, shown at start and in the list (after later restarts too), never dropped.
    ini, folder, first, a = _chat_with_unsent_text(qtbot, tmp_path)
    first.new_chat()
    first.send("Chat B")
    finish(first)
    b = first.current.id
    first.close()
    first.store.path_of(a).write_text('{"id": "' + a + '", "messages": [', encoding="utf-8")   # cut short
    second = make_chat(qtbot, folder, settings_file=ini)
    assert len(list(folder.glob(f"{a}.corrupt-*.json"))) == 1
    kept = second.current
    assert kept.id not in (a, b) and kept in second.conversations and kept.title == "Unsent text of a damaged chat"
    assert second.pane.input.toPlainText() == "half a question for A"
    notices = [t for t in bubble_texts(second) if "half a question" not in t]
    assert any(f"{a}.json is damaged" in t for t in notices)
    assert any(f"unsent text of {a}.json" in t and "Unsent text of a damaged chat" in t for t in notices)
    second.open(b)
    second.close()
    third = make_chat(qtbot, folder, settings_file=ini)
    third.open(kept.id)
    assert third.pane.input.toPlainText() == "half a question for A"


def test_the_unsent_text_of_a_chat_whose_file_cannot_be_read_waits_for_it(qtbot, tmp_path, monkeypatch):
    # A file that cannot be read for now (its permissions) is not gone: its chat's unsent text stays with
    # it, and no new chat is saved over the file meanwhile.
    ini, folder, first, a = _chat_with_unsent_text(qtbot, tmp_path)
    first.close()
    path = first.store.path_of(a)
    before, read_bytes = path.read_bytes(), Path.read_bytes

    def refused(self: Path) -> bytes:
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return read_bytes(self)

    with monkeypatch.context() as m:
        m.setattr(Path, "read_bytes", refused)
        second = make_chat(qtbot, folder, settings_file=ini)
        assert second.library.find(a) is None and second.current.id != a
        second.send("Another chat")
        finish(second)
        second.close()
    assert path.read_bytes() == before
    third = make_chat(qtbot, folder, settings_file=ini)
    third.open(a)
    assert third.current.id == a and third.pane.input.toPlainText() == "half a question for A"


def test_a_single_box_draft_of_an_earlier_version_goes_to_the_chat_shown_and_others_stay(qtbot, tmp_path):
    # a draft of a chat this data folder does not hold stays: the chat may be in the trash or in another
    # data folder (a start with another XDG_DATA_HOME must not erase it)
    ini = tmp_path / "strata.ini"
    old = QSettings(str(ini), QSettings.Format.IniFormat)
    old.setValue("chat/draft", "typed before the upgrade")
    old.setValue("chat/drafts/0123456789ab", "for a chat that no longer exists")
    old.sync()
    chat = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert chat.pane.input.toPlainText() == "typed before the upgrade"
    assert sorted(chat.prefs.drafted()) == sorted([chat.current.id, "0123456789ab"])
    assert chat.prefs.draft("0123456789ab") == "for a chat that no longer exists"
    assert chat.prefs.settings.value("chat/draft") is None


def test_deleting_the_chat_shown_while_its_prompt_edit_is_pending_leaves_it_deleted(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Hello")
    finish(chat)
    gone = chat.current.id
    chat.pane.settings_box.system_prompt.setPlainText("Be brief.")      # kept at once, and again when due
    assert chat.edit_saves.timer.isActive()
    chat.delete(gone)
    qtbot.wait(50)
    assert chat.library.find(gone) is None and chat.current.id != gone
    chat.library.close()
    assert not (tmp_path / "c" / f"{gone}.json").exists()


def test_an_edited_message_is_in_the_kept_box_text_before_it_leaves_the_chat(qtbot, tmp_path):
    # Edit puts the last message back into the box and removes it from the saved chat; a kill right
    # after must not lose it: the box text is written first, at once, not a second later.
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "An answer.")
    chat.confirm = lambda _t, _q: True
    kept: list[str] = []
    chat.prefs.set_draft = lambda text, _chat: kept.append(text)   # what reaches the settings, in order
    saved_then = []
    chat.prefs.sync = lambda: saved_then.append(list(m.content for m in chat.current.messages))
    chat.edit_last()
    assert kept and kept[0] == "Tell me"
    assert saved_then[0] == ["Tell me", "An answer."]  # written while the chat still held the message
    assert on_disk(chat)["messages"] == []


def test_the_unsent_text_is_kept_while_someone_types_without_pausing(qtbot, tmp_path):
    # The save is due EDITS_SAVE_MS after the first keystroke not yet kept: later keystrokes do not
    # push it back, so steady typing is kept every second rather than never.
    chat = make_chat(qtbot, tmp_path / "c")
    chat.pane.input.setPlainText("a")
    assert chat.edit_saves.timer.isActive()
    first = chat.edit_saves.timer.remainingTime()
    qtbot.wait(30)
    chat.pane.input.setPlainText("ab")
    assert chat.edit_saves.timer.isActive() and chat.edit_saves.timer.remainingTime() <= first


def test_a_keystroke_just_before_the_pane_goes_leaves_no_timer_behind(qtbot, tmp_path):
    # the controller's timers belong to the pane: a pending "keep the unsent text" never fires at a
    # deleted one (pytest-qt fails the test on any exception raised in the event loop)
    from PySide6.QtCore import QEventLoop, QTimer

    from app.chat_controller import EDITS_SAVE_MS
    chat = make_chat(qtbot, tmp_path / "conversations")
    chat.pane.input.setPlainText("typed just before the window went")
    assert chat.edit_saves.timer.isActive()
    chat.pane.deleteLater()
    loop = QEventLoop()
    QTimer.singleShot(EDITS_SAVE_MS + 300, loop.quit)
    loop.exec()


def test_a_system_prompt_written_in_a_new_chat_outlives_a_quit_and_a_crash(qtbot, tmp_path):
    # before its first message: saved as the chat's own once the edits are kept, and at a quit
    folder = tmp_path / "c"
    chat = make_chat(qtbot, folder)
    chat.new_chat()
    chat.pane.settings_box.system_prompt.setPlainText("A carefully written system prompt")
    chat.close()                                       # a quit before the timer fires
    again = make_chat(qtbot, folder)
    assert again.pane.settings_box.system_prompt.toPlainText() == "A carefully written system prompt"
    again.new_chat()
    again.pane.settings_box.system_prompt.setPlainText("Another one")
    qtbot.waitUntil(lambda: not again.edit_saves.timer.isActive(), timeout=5000)   # kept: what a crash finds
    assert again.library.flush(10)         # once the writer thread has it on disk (a busy host delays it)
    third = make_chat(qtbot, folder)
    assert third.pane.settings_box.system_prompt.toPlainText() == "Another one"
