"""What the user saw survives: a streaming reply on disk, versions of a reply, undo of a delete, a store that
cannot be written, damaged files. The controller runs on real widgets and a real store; the tests play the
bridge (see chat_fakes)."""
from __future__ import annotations

import errno
import json
import os
from functools import partial
from pathlib import Path

from PySide6.QtWidgets import QMessageBox

from app.chat_controller import INTERRUPTED_NOTE, STREAM_SAVE_MS
from app.dialogs import ask
from tests.app.chat_fakes import SEEN, bubble_texts, exchange, finish, make_chat, message_texts, on_disk, stream


# --- a reply in flight ---------------------------------------------------------------------------------
def test_a_streaming_reply_is_saved_at_its_first_text_then_paced_and_marked_interrupted(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Genesis")
    saved = on_disk(chat)["messages"]
    # the user's message and the empty reply are on disk before the first token
    assert [(m["role"], m["content"], m["interrupted"]) for m in saved] == [("user", "Genesis", False),
                                                                        ("assistant", "", True)]
    stream(chat, SEEN[:20])
    reply = on_disk(chat)["messages"][1]
    assert reply["content"] == SEEN[:20] and reply["interrupted"] is True, "the first text is saved at once"
    stream(chat, SEEN[20:25])
    stream(chat, SEEN[25:30])      # more text while a save is due: one save covers both
    assert on_disk(chat)["messages"][1]["content"] == SEEN[:20], "not a write per token"
    assert chat.stream_saves.timer.isActive() and STREAM_SAVE_MS <= 1000
    chat.stream_saves.timer.timeout.emit()
    reply = on_disk(chat)["messages"][1]
    assert reply["content"] == SEEN[:30] == chat.live_bubble.text and reply["interrupted"] is True
    stream(chat, SEEN[30:])
    assert chat.stream_saves.timer.isActive(), "new text on screen waits for the next save"
    on_screen = chat.live_bubble.text
    behind = on_disk(chat)["messages"][1]["content"]
    assert on_screen.startswith(behind) and behind != on_screen
    finish(chat)
    reply = on_disk(chat)["messages"][1]
    assert reply["content"] == SEEN and reply["interrupted"] is False and "finished" in reply["stats"]
    assert not chat.stream_saves.timer.isActive()


def test_after_a_crash_the_cut_short_reply_is_shown_with_its_note_and_can_be_asked_again(qtbot, tmp_path):
    folder = tmp_path / "c"
    first = make_chat(qtbot, folder)
    first.send("Genesis")
    stream(first, SEEN[:25])
    first.stream_saves.timer.timeout.emit()
    assert first.library.flush(10)
    # the process dies here: no on_finished, no close. The next start reads the same folder.
    second = make_chat(qtbot, folder)
    assert second.current.id == first.current.id
    bubble = second.pane.view.bubbles[-1]
    assert bubble.text == SEEN[:25]
    assert INTERRUPTED_NOTE in bubble.stats.text() and bubble.stats.isVisible()
    assert "interrupted — Strata stopped before this reply finished" in bubble.stats.text()
    assert second.pane.regen_button.isEnabled()
    second.regenerate()
    request = second.bridge.requests[-1]
    assert [(m.role, m.content) for m in request.messages] == [("user", "Genesis")]
    stream(second, "A new reply.")
    finish(second)
    reply = on_disk(second)["messages"][1]
    assert [a["content"] for a in reply["alternatives"]] == [SEEN[:25], "A new reply."]
    assert [a["interrupted"] for a in reply["alternatives"]] == [True, False]
    assert bubble.pager_label.text() == "2/2"
    bubble.prev_button.click()
    assert bubble.text == SEEN[:25] and INTERRUPTED_NOTE in bubble.stats.text()


def test_a_crash_before_the_first_token_leaves_an_empty_reply_that_regenerate_replaces(qtbot, tmp_path):
    folder = tmp_path / "c"
    first = make_chat(qtbot, folder)
    first.send("Genesis")
    assert first.library.flush(10)      # the save handed over at send reaches the disk; then the crash
    second = make_chat(qtbot, folder)
    assert INTERRUPTED_NOTE in second.pane.view.bubbles[-1].stats.text()
    second.regenerate()
    stream(second, "Now it answers.")
    finish(second)
    reply = on_disk(second)["messages"][1]
    assert reply["content"] == "Now it answers." and reply["alternatives"] == []   # nothing was lost to keep


def test_close_writes_the_reply_in_flight_still_marked_interrupted(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Genesis")
    stream(chat, SEEN)
    chat.close()
    reply = on_disk(chat)["messages"][1]
    assert reply["content"] == SEEN and reply["interrupted"] is True


def test_the_engines_last_word_after_a_quit_leaves_the_reply_marked_interrupted(qtbot, tmp_path):
    # the window closes the chat before the engine: the reply's end, arriving after, changes nothing saved
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Tell me")
    stream(chat, "Once upon")
    conv_id = chat.current.id
    chat.close()
    finish(chat, "error", error="the workbench was closed")
    saved = json.loads(chat.store.path_of(conv_id).read_text(encoding="utf-8"))["messages"][-1]
    assert saved["content"] == "Once upon" and saved["interrupted"] is True


# --- versions of a reply --------------------------------------------------------------------------------
def test_regenerate_keeps_the_earlier_reply_as_a_version_and_the_model_sees_the_one_shown(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "First answer.")
    chat.regenerate()
    # the earlier reply is on disk, untouched, before the new one has a single token
    reply = on_disk(chat)["messages"][1]
    assert reply["alternatives"][0]["content"] == "First answer." and reply["alternatives"][1]["interrupted"]
    bubble = chat.pane.view.bubbles[-1]
    assert bubble.pager_label.text() == "2/2" and not bubble.prev_button.isEnabled(), "no paging while it streams"
    stream(chat, "Second answer.")
    finish(chat)
    assert [m.role for m in chat.current.messages] == ["user", "assistant"]
    assert bubble.text == "Second answer." and bubble.prev_button.isEnabled() and not bubble.next_button.isEnabled()
    bubble.prev_button.click()
    assert bubble.text == "First answer." and bubble.pager_label.text() == "1/2"
    assert on_disk(chat)["messages"][1]["chosen"] == 0
    chat.send("And then?")
    history = [(m.role, m.content) for m in chat.bridge.requests[-1].messages]
    assert history == [("user", "Tell me"), ("assistant", "First answer."), ("user", "And then?")]
    finish(chat)
    assert chat.library.flush(10)
    # a later start shows the version the user chose, with the pager
    again = make_chat(qtbot, tmp_path / "c")
    old = again.pane.view.bubbles[1]
    assert old.text == "First answer." and old.pager_label.text() == "1/2" and old.pager_label.isVisible()


def test_deleting_a_version_asks_first_and_keeps_the_others(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "One.")
    for text in ("Two.", "Three."):
        chat.regenerate()
        stream(chat, text)
        finish(chat)
    bubble = chat.pane.view.bubbles[-1]
    bubble.prev_button.click()                                       # shows "Two."
    asked: list[str] = []
    chat.confirm = lambda title, question: asked.append(question) is not None   # says no
    bubble.delete_version_button.click()
    assert asked and "Version 2 of 3" in asked[0]
    assert len(on_disk(chat)["messages"][1]["alternatives"]) == 3
    chat.confirm = lambda _t, _q: True
    bubble.delete_version_button.click()
    saved = on_disk(chat)["messages"][1]
    assert [a["content"] for a in saved["alternatives"]] == ["One.", "Three."] and saved["content"] == "Three."
    assert bubble.text == "Three." and bubble.pager_label.text() == "2/2"
    bubble.delete_version_button.click()
    assert not bubble.delete_version_button.isVisible() and not bubble.pager_label.isVisible()
    assert on_disk(chat)["messages"][1]["content"] == "One."


def test_edit_last_asks_before_a_reply_is_removed(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "An answer worth keeping.")
    questions: list[str] = []
    chat.confirm = lambda _t, q: questions.append(q) is None and False
    chat.edit_last()
    assert "its reply is removed from the chat for good" in questions[0]
    assert bubble_texts(chat) == ["Tell me", "An answer worth keeping."]
    assert len(on_disk(chat)["messages"]) == 2
    chat.pane.input.setPlainText("half-typed")
    chat.confirm = lambda _t, q: questions.append(q) is None
    chat.edit_last()
    assert "The text now in the box is replaced" in questions[1]
    assert chat.current.messages == [] and chat.pane.input.toPlainText() == "Tell me"
    assert on_disk(chat)["messages"] == []


def test_the_question_is_a_real_dialog_whose_cancel_keeps_everything(qtbot, tmp_path, monkeypatch):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "Keep this.")
    chat.confirm = partial(ask, chat.pane)          # the window's own question, not the tests' yes-man
    asked: list[str] = []

    def cancel(_parent, title, _question, _buttons, default):
        asked.append(title)
        assert default == QMessageBox.StandardButton.Cancel, "the safe answer is the default"
        return QMessageBox.StandardButton.Cancel

    monkeypatch.setattr(QMessageBox, "question", cancel)
    chat.pane.edit_button.click()
    assert asked == ["Edit your last message?"] and message_texts(chat) == ["Tell me", "Keep this."]


def test_edit_last_without_a_reply_to_lose_does_not_ask(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Tell me")
    finish(chat, "error", completion_tokens=0, error="the model was closed")
    chat.confirm = lambda _t, _q: (_ for _ in ()).throw(AssertionError("asked although nothing is lost"))
    chat.edit_last()
    assert chat.pane.input.toPlainText() == "Tell me" and chat.current.messages == []


# --- deleting a conversation -----------------------------------------------------------------------------
def test_delete_moves_the_conversation_to_the_trash_and_undo_brings_it_back(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "Keep me.", question="Precious chat")
    conv_id = chat.current.id
    path = chat.store.path_of(conv_id)
    data = on_disk(chat)
    chat.sidebar.delete_button.click()
    assert chat.library.flush(10)
    assert not path.exists() and (chat.store.trash_folder / path.name).exists()
    assert chat.sidebar.list.count() == 0 and bubble_texts(chat) == []
    assert chat.sidebar.undo_bar.isVisible() and "Deleted “Precious chat”" in chat.sidebar.undo_label.text()
    chat.sidebar.undo_button.click()
    assert chat.current.id == conv_id and bubble_texts(chat) == ["Precious chat", "Keep me."]
    assert chat.sidebar.list.count() == 1 and not chat.sidebar.undo_bar.isVisible()
    assert on_disk(chat, conv_id)["messages"] == data["messages"]
    assert not (chat.store.trash_folder / path.name).exists()


def test_undo_restores_deletes_newest_first(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "a", question="Chat A")
    chat.new_chat()
    exchange(chat, "b", question="Chat B")
    chat.delete(chat.current.id)
    chat.delete(chat.current.id)
    assert chat.conversations == [] and "Chat A" in chat.sidebar.undo_label.text()
    chat.undo_delete()
    assert chat.current.title == "Chat A" and "Chat B" in chat.sidebar.undo_label.text()
    chat.undo_delete()
    assert [c.title for c in chat.conversations] == ["Chat B", "Chat A"]      # each in its place again
    assert chat.library.flush(10) and len(list(chat.store.folder.glob("*.json"))) == 2


def test_undo_gives_a_chat_back_as_it_was_its_time_and_place_in_the_list_too(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "old", question="Older chat")
    older = chat.current
    older.updated -= 3600                         # an hour ago
    chat.new_chat()
    exchange(chat, "new", question="Newer chat")
    when = older.updated
    chat.delete(older.id)
    chat.undo_delete()
    assert older.updated == when and [c.title for c in chat.conversations] == ["Newer chat", "Older chat"]
    assert on_disk(chat, older.id)["updated"] == when


def test_an_unsaved_conversation_deleted_and_undone_is_written(qtbot, tmp_path):
    blocker = tmp_path / "c"
    blocker.write_text("in the way")
    chat = make_chat(qtbot, blocker)
    exchange(chat, "only in memory")
    chat.delete(chat.current.id)
    assert chat.library.flush(10)
    blocker.unlink()
    chat.undo_delete()
    assert on_disk(chat)["messages"][1]["content"] == "only in memory"


# --- a store that cannot be written, files that cannot be read -------------------------------------------
def test_an_unwritable_store_is_reported_and_the_chat_goes_on_in_memory(qtbot, tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the conversations folder should be")
    folder = blocker / "conversations"
    chat = make_chat(qtbot, folder)
    with qtbot.waitSignal(chat.store_error, timeout=10_000) as failed:
        chat.send("Does this get lost?")
    line = failed.args[0]
    assert line.startswith(f"Conversations cannot be saved in {folder}: Not a directory.")
    assert f"rename {blocker}" in line and "kept in memory" in line and "\n" not in line
    assert chat.bridge.requests, "the request still goes to the engine"
    stream(chat, "Yes it streams.")
    assert message_texts(chat) == ["Does this get lost?", "Yes it streams."]
    assert any(line in t for t in bubble_texts(chat)), "the transcript says it too"
    errors: list[str] = []
    chat.store_error.connect(errors.append)
    finish(chat)
    assert chat.library.flush(10)
    qtbot.wait(0)
    assert errors == [], "the same failure is reported once, not at every save"
    blocker.unlink()                                  # the user clears the way
    with qtbot.waitSignal(chat.store_error, timeout=10_000) as cleared:
        chat.send("And now?")
    assert cleared.args[0] == ""
    saved = on_disk(chat)["messages"]
    assert [m["content"] for m in saved[:3]] == ["Does this get lost?", "Yes it streams.", "And now?"]
    assert any("saved again" in t for t in bubble_texts(chat))


def test_a_full_disk_is_reported_with_its_fix(qtbot, tmp_path, monkeypatch):
    chat = make_chat(qtbot, tmp_path / "c")

    def full(_src, _dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with qtbot.waitSignal(chat.store_error, timeout=10_000) as failed:
        chat.send("Hello")
    assert "No space left on device" in failed.args[0] and "free some disk space" in failed.args[0]
    assert str(tmp_path / "c") in failed.args[0]
    assert not list((tmp_path / "c").glob("*.tmp")), "no temporary file is left behind"


def test_a_damaged_file_is_reported_and_set_aside_when_the_chat_starts(qtbot, tmp_path):
    folder = tmp_path / "c"
    first = make_chat(qtbot, folder)
    exchange(first, "fine")
    assert first.library.flush(10)
    (folder / "mangled.json").write_text('{"id": "mangled", "messages": [{"role": "user", "content": 7}]}')
    second = make_chat(qtbot, folder)
    with qtbot.waitSignal(second.store_error, timeout=10_000) as reported:
        pass
    line = reported.args[0]
    assert "mangled.json is damaged (messages[0].content is a number, expected text)" in line
    assert "mangled.corrupt-" in line and any("mangled.json is damaged" in t for t in bubble_texts(second))
    assert [c.id for c in second.conversations] == [first.current.id]
    assert len(list(folder.glob("mangled.corrupt-*.json"))) == 1


def test_a_system_prompt_edit_is_saved_to_its_own_conversation(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    exchange(chat, "a", question="Chat A")
    first = chat.current.id
    chat.pane.settings_box.system_prompt.setPlainText("Be brief.")
    assert chat.edit_saves.timer.isActive() and chat.edit_saves.timer.interval() <= 1000
    chat.new_chat()                                   # before the timer fires
    chat.pane.settings_box.system_prompt.setPlainText("Be verbose.")
    exchange(chat, "b", question="Chat B")
    assert on_disk(chat, first)["system_prompt"] == "Be brief."
    assert on_disk(chat)["system_prompt"] == "Be verbose."
    chat.open(first)
    assert chat.pane.settings_box.system_prompt.toPlainText() == "Be brief."


def test_a_killed_writes_leftover_temporary_copy_is_removed_at_start(tmp_path):
    import os
    import time
    from app.conversations import STALE_TMP_S, ConversationStore
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "abc.json").write_text("{}")
    old, fresh, new = folder / ".abc.k2x9_q1z.tmp", folder / ".abc.x2x2x2x2.tmp", folder / ".0123456789ab.abcdefgh.tmp"
    # a user's own files that merely look alike: not the store's pattern, or an id with no conversation here
    mine = [folder / "notes.tmp", folder / ".my-notes.tmp", folder / ".backup.of.chat.tmp", folder / ".xyz.abcdefgh.tmp"]
    past = time.time() - STALE_TMP_S - 60
    for p in (old, fresh, new, *mine):
        p.write_text("{")
        if p is not fresh:
            os.utime(p, (past, past))
    ConversationStore(folder).load_all()
    assert not old.exists() and not new.exists() and fresh.exists()   # only the store's own, and only stale
    assert all(p.exists() for p in mine)


def test_a_data_folder_that_cannot_be_written_is_said_at_start_and_cleared_by_a_save(qtbot, tmp_path, monkeypatch):
    # before any save fails: the window says at once that chats cannot be saved there, and why
    import app.conversations as conversations
    folder = tmp_path / "c"
    folder.mkdir()
    writable = conversations.os.access
    monkeypatch.setattr(conversations.os, "access", lambda p, mode: False if Path(p) == folder else writable(p, mode))
    chat = make_chat(qtbot, folder)
    lines: list[str] = []
    chat.store_error.connect(lines.append)
    qtbot.waitUntil(lambda: bool(lines), timeout=5_000)
    assert lines[0].startswith(f"Conversations cannot be saved in {folder}: Permission denied. To fix it, make "
                               f"{folder} writable")
    assert lines[0] in bubble_texts(chat)
    monkeypatch.setattr(conversations.os, "access", writable)
    chat.send("Tell me")
    finish(chat)
    qtbot.waitUntil(lambda: lines[-1] == "", timeout=5_000)     # the save went through: the banner goes
