"""What the user saw survives: a streaming reply on disk, versions of a reply, undo of a delete, a store that
cannot be written, damaged files. The controller runs on real widgets and a real store; the tests play the
bridge (see chat_fakes)."""
from __future__ import annotations

import errno
import json
import os
from functools import partial
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication, QMessageBox

from app.chat_controller import INTERRUPTED_NOTE, STREAM_SAVE_MS
from app.dialogs import ask
from app.messages import ContextUsage
from tests.app.chat_fakes import CHAT_MODEL, bubble_texts, finish, make_chat, message_texts, on_disk, stream

SEEN = "In the beginning God created the heaven and the earth."


def _reply(chat, text: str, question: str = "Tell me") -> None:
    chat.send(question)
    stream(chat, text)
    finish(chat)


# --- a reply in flight ---------------------------------------------------------------------------------
def test_a_streaming_reply_is_saved_within_a_second_of_the_screen_and_marked_interrupted(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Genesis")
    saved = on_disk(chat)["messages"]
    # the user's message and the empty reply are on disk before the first token
    assert [(m["role"], m["content"], m["interrupted"]) for m in saved] == [("user", "Genesis", False),
                                                                        ("assistant", "", True)]
    stream(chat, SEEN[:20])
    assert chat.stream_timer.isActive() and chat.stream_timer.interval() <= 1000 == STREAM_SAVE_MS
    stream(chat, SEEN[20:30])      # more text while the save is due: one save covers both
    chat.stream_timer.timeout.emit()
    reply = on_disk(chat)["messages"][1]
    assert reply["content"] == SEEN[:30] == chat.live_bubble.text and reply["interrupted"] is True
    stream(chat, SEEN[30:])
    assert chat.stream_timer.isActive(), "new text on screen arms the next save"
    on_screen = chat.live_bubble.text
    behind = on_disk(chat)["messages"][1]["content"]
    assert on_screen.startswith(behind) and behind != on_screen
    finish(chat)
    reply = on_disk(chat)["messages"][1]
    assert reply["content"] == SEEN and reply["interrupted"] is False and "finished" in reply["stats"]
    assert not chat.stream_timer.isActive()


def test_after_a_crash_the_cut_short_reply_is_shown_with_its_note_and_can_be_asked_again(qtbot, tmp_path):
    folder = tmp_path / "c"
    first = make_chat(qtbot, folder)
    first.send("Genesis")
    stream(first, SEEN[:25])
    first.stream_timer.timeout.emit()
    assert first.library.flush(10)
    # the process dies here: no on_finished, no close. The next start reads the same folder.
    second = make_chat(qtbot, folder)
    assert second.current.id == first.current.id
    bubble = second.pane.view.bubbles[-1]
    assert bubble.text == SEEN[:25]
    assert INTERRUPTED_NOTE in bubble.stats.text() and bubble.stats.isVisible()
    assert "interrupted — the app closed before this reply finished" in bubble.stats.text()
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


# --- versions of a reply --------------------------------------------------------------------------------
def test_regenerate_keeps_the_earlier_reply_as_a_version_and_the_model_sees_the_one_shown(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    _reply(chat, "First answer.")
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
    _reply(chat, "One.")
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
    _reply(chat, "An answer worth keeping.")
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
    _reply(chat, "Keep this.")
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
    _reply(chat, "Keep me.", question="Precious chat")
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
    _reply(chat, "a", question="Chat A")
    chat.new_chat()
    _reply(chat, "b", question="Chat B")
    chat.delete(chat.current.id)
    chat.delete(chat.current.id)
    assert chat.conversations == [] and "Chat A" in chat.sidebar.undo_label.text()
    chat.undo_delete()
    assert chat.current.title == "Chat A" and "Chat B" in chat.sidebar.undo_label.text()
    chat.undo_delete()
    assert sorted(c.title for c in chat.conversations) == ["Chat A", "Chat B"]
    assert chat.library.flush(10) and len(list(chat.store.folder.glob("*.json"))) == 2


def test_an_unsaved_conversation_deleted_and_undone_is_written(qtbot, tmp_path):
    blocker = tmp_path / "c"
    blocker.write_text("in the way")
    chat = make_chat(qtbot, blocker)
    _reply(chat, "only in memory")
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
    _reply(first, "fine")
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
    _reply(chat, "a", question="Chat A")
    first = chat.current.id
    chat.pane.settings_box.system_prompt.setPlainText("Be brief.")
    assert chat.edits_timer.isActive() and chat.edits_timer.interval() <= 1000
    chat.new_chat()                                   # before the timer fires
    chat.pane.settings_box.system_prompt.setPlainText("Be verbose.")
    _reply(chat, "b", question="Chat B")
    assert on_disk(chat, first)["system_prompt"] == "Be brief."
    assert on_disk(chat)["system_prompt"] == "Be verbose."
    chat.open(first)
    assert chat.pane.settings_box.system_prompt.toPlainText() == "Be brief."


# --- the context meter ------------------------------------------------------------------------------------
def test_the_context_meter_follows_the_current_chat(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c", model=None)
    meter = chat.pane.context_meter
    assert meter.label.text() == "Context —"
    chat.set_model(CHAT_MODEL)
    assert meter.label.text() == "Context — / 512 tokens" and meter.bar.value() == 0
    chat.send("Tell me")
    request_id = chat.live_id
    note = "The conversation outgrew the context: the 2 oldest messages were left out."
    chat.on_context(ContextUsage("someone-else", 500, 512, 64, 3, "not this chat"))
    assert meter.label.text() == "Context — / 512 tokens"
    chat.on_context(ContextUsage(request_id, 312, 512, 64, dropped_messages=2, note=note))
    assert meter.label.text() == "Context 312 / 512 tokens" and meter.bar.value() == 609
    texts = bubble_texts(chat)
    assert texts.index(note) == texts.index("Tell me") + 1, "the note stands above the reply it explains"
    stream(chat, "Sure.")
    finish(chat, prompt_tokens=312, completion_tokens=40)
    assert meter.label.text() == "Context 352 / 512 tokens"
    chat.new_chat()
    assert meter.label.text() == "Context — / 512 tokens"
    chat.open(chat.conversations[0].id)
    assert meter.label.text() == "Context 352 / 512 tokens"
    chat.confirm = lambda _t, _q: True
    chat.edit_last()                        # the exchange it counted is gone: unknown until the next request
    assert meter.label.text() == "Context — / 512 tokens" and meter.bar.value() == 0
    assert on_disk(chat)["context_used"] is None


def test_a_completion_prompt_cut_at_its_start_says_so(qtbot, tmp_path):
    # A base model's prompt is text: fitting it drops tokens, not messages, and the transcript says so too.
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("a very long text")
    note = "dropped the first 1900 tokens of the prompt to fit the 512-token context"
    chat.on_context(ContextUsage(chat.live_id, 384, 512, 128, dropped_messages=0, note=note))
    assert note in bubble_texts(chat)


def test_a_restored_chat_shows_the_context_its_last_request_took(qtbot, tmp_path):
    # What the meter showed survives a restart: the count is saved with the chat, not only kept in memory.
    first = make_chat(qtbot, tmp_path / "c")
    first.send("Tell me")
    chat_id = first.current.id
    first.on_context(ContextUsage(first.live_id, 312, 512, 64))
    stream(first, "Sure.")
    finish(first, prompt_tokens=312, completion_tokens=40)
    assert on_disk(first)["context_used"] == 352
    again = make_chat(qtbot, tmp_path / "c")
    again.open(chat_id)
    assert again.pane.context_meter.label.text() == "Context 352 / 512 tokens"


def test_after_a_crash_mid_reply_the_meter_counts_the_reply_that_was_saved(qtbot, tmp_path):
    # The count saved with the streaming reply is the prompt and the reply so far, not the prompt alone
    # from when the reply began: a restart after a crash shows how full the context is.
    first = make_chat(qtbot, tmp_path / "c")
    first.send("Tell me")
    first.on_context(ContextUsage(first.live_id, 7, 512, 64))
    stream(first, SEEN[:20], used_tokens=12)
    first.stream_timer.timeout.emit()
    assert first.pane.context_meter.label.text() == "Context 12 / 512 tokens"     # it grows as the reply is saved
    stream(first, SEEN[20:], used_tokens=177)
    first.stream_timer.timeout.emit()
    assert on_disk(first)["context_used"] == 177
    # the process dies here: no on_finished, no close
    again = make_chat(qtbot, tmp_path / "c")
    assert again.pane.view.bubbles[-1].text == SEEN
    assert again.pane.context_meter.label.text() == "Context 177 / 512 tokens"


def test_an_edited_message_is_in_the_kept_box_text_before_it_leaves_the_chat(qtbot, tmp_path):
    # Edit puts the last message back into the box and removes it from the saved chat; a kill right
    # after must not lose it: the box text is written first, at once, not a second later.
    chat = make_chat(qtbot, tmp_path / "c")
    _reply(chat, "An answer.")
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
    assert chat.edits_timer.isActive()
    first = chat.edits_timer.remainingTime()
    qtbot.wait(30)
    chat.pane.input.setPlainText("ab")
    assert chat.edits_timer.isActive() and chat.edits_timer.remainingTime() <= first


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


def test_a_keystroke_just_before_the_pane_goes_leaves_no_timer_behind(qtbot, tmp_path):
    # the controller's timers belong to the pane: a pending "keep the unsent text" never fires at a
    # deleted one (pytest-qt fails the test on any exception raised in the event loop)
    from PySide6.QtCore import QEventLoop, QTimer

    from app.chat_controller import EDITS_SAVE_MS
    chat = make_chat(qtbot, tmp_path / "conversations")
    chat.pane.input.setPlainText("typed just before the window went")
    assert chat.edits_timer.isActive()
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
    qtbot.waitUntil(lambda: not again.edits_timer.isActive(), timeout=5000)   # kept: what a crash finds
    assert again.library.flush(10)         # once the writer thread has it on disk (a busy host delays it)
    third = make_chat(qtbot, folder)
    assert third.pane.settings_box.system_prompt.toPlainText() == "Another one"


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


def test_paging_through_versions_does_not_move_the_chat_up_the_list(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    _reply(chat, "first", question="Older chat")
    older = chat.current
    chat.regenerate()
    stream(chat, "second")
    finish(chat)
    chat.new_chat()
    _reply(chat, "x", question="Newer chat")
    chat.open(older.id)
    before = older.updated
    chat.page(chat._bubbles[-1], -1)
    assert older.updated == before and chat.conversations.index(older) > 0
    assert on_disk(chat, older.id)["messages"][-1]["content"] == "first"


def test_a_long_chat_opens_at_once_and_its_earlier_messages_follow_in_order(qtbot, tmp_path):
    from app.chat_controller import SHOWN_AT_ONCE
    from app.conversations import Conversation, StoredMessage
    chat = make_chat(qtbot, tmp_path / "c")
    long = Conversation(messages=[StoredMessage("user" if i % 2 == 0 else "assistant", f"message {i}")
                                  for i in range(130)])
    chat.library.save(long)
    chat.open(long.id)
    assert len(chat.pane.view.bubbles) == SHOWN_AT_ONCE                  # on screen before any event
    qtbot.waitUntil(lambda: len(chat.pane.view.bubbles) == 130, timeout=10_000)
    assert [b.text for b in chat.pane.view.bubbles] == [f"message {i}" for i in range(130)]
    assert chat._bubbles == chat.pane.view.bubbles


def test_a_very_long_chat_shows_its_last_messages_and_offers_the_earlier_ones(qtbot, tmp_path, monkeypatch):
    # every message on screen makes each later layout pass longer: past SHOWN_MESSAGES they wait to be asked for
    import app.chat_controller as cc
    from app.conversations import Conversation, StoredMessage
    monkeypatch.setattr(cc, "SHOWN_MESSAGES", 40)
    chat = make_chat(qtbot, tmp_path / "c")
    n = 100
    long = Conversation(messages=[StoredMessage("user" if i % 2 == 0 else "assistant", f"message {i}")
                                  for i in range(n)])
    chat.library.save(long)
    chat.open(long.id)
    view = chat.pane.view
    qtbot.waitUntil(lambda: view.earlier_button.isVisibleTo(view), timeout=10_000)
    assert [b.text for b in view.bubbles] == [f"message {i}" for i in range(n - 40, n)]
    assert view.earlier_button.text() == "Show earlier messages (60 more)"
    view.earlier_button.click()
    qtbot.waitUntil(lambda: len(view.bubbles) == 80 and view.earlier_button.isVisibleTo(view), timeout=10_000)
    assert view.earlier_button.text() == "Show earlier messages (20 more)"
    view.earlier_button.click()
    qtbot.waitUntil(lambda: len(view.bubbles) == n, timeout=10_000)
    assert [b.text for b in view.bubbles] == [f"message {i}" for i in range(n)] and chat._bubbles == view.bubbles
    assert not view.earlier_button.isVisibleTo(view)
    chat.new_chat()                                                     # another chat: no offer left over
    assert not view.earlier_button.isVisibleTo(view)


def test_a_chat_exports_as_markdown_or_json_and_a_failed_export_leaves_nothing(qtbot, tmp_path):
    from app.chat_export import export_chat
    from app.conversations import Conversation
    chat = make_chat(qtbot, tmp_path / "c")
    chat.pane.settings_box.system_prompt.setPlainText("Be brief.")
    _reply(chat, "It is *blue*.", question="What colour is the sky?")
    conv = chat.current
    (tmp_path / "out").mkdir()
    md = export_chat(conv, tmp_path / "out" / "sky")                # no extension: Markdown
    text = md.read_text(encoding="utf-8")
    assert md.name == "sky.md" and "**System prompt**\n\nBe brief." in text
    assert "## You\n\nWhat colour is the sky?" in text and "## Assistant\n\nIt is *blue*." in text
    back = export_chat(conv, tmp_path / "out" / "sky.json")
    assert Conversation.from_json(json.loads(back.read_text(encoding="utf-8"))).messages == conv.messages
    for bad in (tmp_path / "out", tmp_path / "missing" / "x.md"):     # a folder; a folder that is not there
        with pytest.raises(OSError):
            export_chat(conv, bad)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sky.json", "sky.md"]


def test_headings_in_a_message_sit_under_its_speaker_in_the_markdown():
    from app.chat_export import chat_markdown
    from app.conversations import Conversation, StoredMessage
    conv = Conversation(title="Notes", messages=[
        StoredMessage("user", "## You\nnot a speaker\n```\n# a comment in code\n```\n###### deepest"),
        StoredMessage("assistant", "# Answer\ntext")])
    text = chat_markdown(conv)
    assert text.count("\n## You\n") == 1 and "#### You\nnot a speaker" in text    # the user's own, two down
    assert "# a comment in code" in text and "\n###### deepest" in text          # code as written; at most six
    assert "## Assistant\n\n### Answer\ntext" in text


def test_earlier_messages_put_in_above_keep_the_readers_place(qtbot):
    from app.chat_view import ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    for i in range(40):
        view.add("user", f"message {i} " + "words " * 30)
    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 2000, timeout=5000)
    bar = view.verticalScrollBar()
    bar.setValue(bar.maximum() // 2)                 # the reader scrolled up
    watched = view.bubbles[20]
    qtbot.wait(50)
    y = watched.mapTo(view.viewport(), watched.rect().topLeft()).y()
    for i in range(20):
        view.add("user", f"earlier {i} " + "words " * 30, before=view.bubbles[0])
    qtbot.wait(200)
    assert abs(watched.mapTo(view.viewport(), watched.rect().topLeft()).y() - y) <= 2


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


def test_a_long_word_leaves_the_transcript_as_wide_as_its_view(qtbot):
    # one URL or long code line used to widen every bubble past the view (no horizontal scroll bar there)
    from app.chat_view import ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    view.add("user", "see https://example.com/some/really/long/path/" + "abcdef0123456789" * 8 + "?q=1")
    view.add("assistant", "```\n" + "x" * 300 + "\n```\n\nand " + "y" * 200)
    qtbot.wait(100)
    assert view.widget().width() <= view.viewport().width()


def test_a_huge_message_shows_its_start_and_names_the_rest_and_copy_keeps_it_all(qtbot):
    # a pasted half-megabyte log: laying it all out froze the window for 1.5 s each time it was shown
    from PySide6.QtGui import QGuiApplication

    from app.chat_view import SHOWN_CHARS, ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    text = "\n\n".join(f"line {i} " + "log words " * 50 for i in range(1000))       # ~510 KB, 1000 blocks
    bubble = view.add("user", text)
    assert sum(len(w.text()) for w in bubble._blocks) < 2 * SHOWN_CHARS and len(bubble._blocks) < 200
    assert bubble.cut_note.isVisibleTo(bubble) and "more characters, not shown here" in bubble.cut_note.text()
    view.resize(400, 300)
    qtbot.wait(50)
    assert view.widget().width() <= view.viewport().width()         # the note wraps: no wider than the view
    bubble.copy()
    assert QGuiApplication.clipboard().text() == text
    streamed = view.add("assistant", streaming=True)
    for i in range(0, len(text), 4096):
        streamed.append(text[i:i + 4096])
    streamed.finish("done")
    assert streamed.text == text and len(streamed._blocks) < 200 and streamed.cut_note.isVisibleTo(streamed)
    short = view.add("user", "hello\n\nthere")
    assert not short.cut_note.isVisibleTo(short) and len(short._blocks) == 2
