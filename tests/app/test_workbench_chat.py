"""Chat against the real engine on the demo model (streaming, stop, regenerate/edit, restart, a crash while a
reply streams), and the chat pane's keys and remembered settings (with a recording bridge)."""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QLabel

from app.chat_controller import INTERRUPTED_NOTE
from app.messages import GenerationSettings, TextBatch
from app.paths import default_model_dir, read_demo_marker
from tests.app.chat_fakes import COMPLETION_MODEL, bubble_texts, finish, make_chat, stream

REPLY_MS = 120_000


def _settings(window, max_tokens: int, temperature: float = 0.0) -> None:
    # greedy by default: the demo's greedy continuations of these prompts never end early (checked to 300
    # tokens), so a reply's length and finish reason do not depend on the luck of a sample
    window.chat_pane.settings_box.set_settings(GenerationSettings(temperature=temperature, top_p=1.0, top_k=0,
                                                                  max_tokens=max_tokens))


def test_prompt_streams_a_reply_with_its_stats(window, qtbot):
    _settings(window, max_tokens=24)
    batches: list[TextBatch] = []
    window.bridge.text.connect(batches.append)
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS) as done:
        window.chat_pane.input.setPlainText("In the beginning")
        window.chat_pane.send_button.click()
    stats = done.args[0]
    bubble = window.chat_pane.view.bubbles[-1]
    streamed = "".join(c.text for b in batches for c in b.chunks if c.request_id == stats.request_id)
    assert streamed and bubble.text == streamed
    assert len(batches) >= 2, "the reply should arrive in several coalesced pieces, not in one block"
    assert stats.finish_reason in ("length", "stop") and 0 < stats.completion_tokens <= 24
    assert stats.ttft_ms is not None and stats.ttft_ms > 0
    line = bubble.stats.text()
    assert "TTFT" in line and "tok/\u2060s" in line and f"{stats.completion_tokens} tokens" in line   # never wraps in "tok/s"
    assert window.chat_pane.send_button.isEnabled() and not window.chat_pane.stop_button.isEnabled()
    # the demo is a small completion model: the window says so, and whether its weights are random
    marker = read_demo_marker(default_model_dir())
    # it ships a chat template it was not trained on: the label says why it continues text, truly
    assert "Completion mode: this is a base model, trained on plain text" in window.chat_pane.mode_label.text()
    line = window.chat_pane.model_line.text()
    assert "Small demo model" in line and "Open a real model" in line
    assert ("random weights" in line) == bool(marker["random_weights"])


def test_stop_mid_reply_keeps_the_partial_text(window, qtbot):
    _settings(window, max_tokens=4000)
    window.chat.send("And God said")
    bubble = window.chat.live_bubble
    qtbot.waitUntil(lambda: len(bubble.text) > 0, timeout=REPLY_MS)
    assert window.chat_pane.stop_button.isEnabled()
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS) as done:
        window.chat_pane.stop_button.click()
    stats = done.args[0]
    assert stats.finish_reason == "abort"
    assert 0 < stats.completion_tokens < 4000
    assert window.chat.current.messages[-1].role == "assistant"
    assert window.chat.current.messages[-1].content == bubble.text != ""
    assert "stopped by you" in bubble.stats.text() and "stop:" not in bubble.stats.text()


def test_regenerate_keeps_versions_and_edit_last_asks(window, qtbot):
    pane = window.chat_pane
    window.chat.new_chat()
    assert not pane.regen_button.isEnabled() and not pane.edit_button.isEnabled()   # nothing to redo in an empty chat
    _settings(window, max_tokens=6)
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat.send("Blessed are the meek")
    first = window.chat.current.messages[-1].content
    _settings(window, max_tokens=6, temperature=1.5)    # sampled: the second reply may differ from the first
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat_pane.regen_button.click()
    roles = [m.role for m in window.chat.current.messages]
    assert roles == ["user", "assistant"], "regenerate adds a version of the reply, not another message"
    reply = window.chat.current.messages[-1]
    assert [r.content for r in reply.replies()][0] == first and len(reply.replies()) == 2
    assert pane.regen_button.isEnabled() and pane.edit_button.isEnabled()
    bubble = window.chat_pane.view.bubbles[-1]
    assert bubble.pager_label.text() == "2/2" and bubble.pager_label.isVisible()
    bubble.prev_button.click()
    assert bubble.text == first
    asked: list[str] = []
    window.chat.confirm = lambda _title, question: asked.append(question) is None
    window.chat_pane.edit_button.click()
    assert "its 2 replies are removed from the chat for good" in asked[0]
    assert window.chat.current.messages == []
    assert window.chat_pane.input.toPlainText() == "Blessed are the meek"
    assert window.chat_pane.input.textCursor().position() == len("Blessed are the meek")   # typing goes on after it
    assert len(window.chat_pane.view.bubbles) == 0
    assert not pane.regen_button.isEnabled() and not pane.edit_button.isEnabled()


def test_a_crash_while_a_reply_streams_keeps_what_was_on_screen(window, qtbot, tmp_path):
    """The store folder copied while the real engine streams is what a crash at that moment leaves."""
    _settings(window, max_tokens=4000)
    prompts: list = []
    window.bridge.context.connect(prompts.append)
    window.chat.send("And God said")
    bubble = window.chat.live_bubble
    saved = window.chat.store.path_of(window.chat.current.id)

    def reply_on_disk() -> str:
        if not saved.exists():          # the writer thread has not written the first save yet
            return ""
        return json.loads(saved.read_text(encoding="utf-8"))["messages"][1]["content"]

    qtbot.waitUntil(lambda: len(reply_on_disk()) > 0, timeout=REPLY_MS)   # the save timer has fired once
    crashed = tmp_path / "after-crash"
    shutil.copytree(saved.parent, crashed)
    on_screen = bubble.text
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS) as done:
        window.chat_pane.stop_button.click()
    restarted = make_chat(qtbot, crashed)
    shown = restarted.pane.view.bubbles[-1]
    assert shown.text and on_screen.startswith(shown.text), "what is on disk is what the screen showed"
    assert INTERRUPTED_NOTE in shown.stats.text()
    # the context meter counts the reply saved, not only the prompt it began with
    used = json.loads((crashed / saved.name).read_text(encoding="utf-8"))["context_used"]
    prompt, stats = prompts[0].prompt_tokens, done.args[0]      # the prompt's tokens, sent before it ran
    assert prompt < used <= stats.prompt_tokens + stats.completion_tokens
    assert restarted.pane.context_meter.label.text() == f"Context {used} / 512 tokens"


def test_conversations_survive_a_restart(window_factory, qtbot, tmp_path):
    first = window_factory()
    _settings(first, max_tokens=8)
    with qtbot.waitSignal(first.chat.reply_done, timeout=REPLY_MS):
        first.chat.send("The Lord is my shepherd")
    reply = first.chat.current.messages[-1].content
    conv_id = first.chat.current.id
    first.chat.close()      # what closing the window does: pending saves are written
    first.close()
    saved = tmp_path / "data" / "strata" / "conversations" / f"{conv_id}.json"
    data = json.loads(saved.read_text(encoding="utf-8"))
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert not list(saved.parent.glob("*.tmp")), "atomic save leaves no temporary files behind"

    second = window_factory()
    assert second.chat.current.id == conv_id
    assert second.sidebar.list.count() == 1
    assert "The Lord is my shepherd" in second.sidebar.list.item(0).text()
    texts = [b.text for b in second.chat_pane.view.bubbles]
    assert texts == ["The Lord is my shepherd", reply]
    assert "TTFT" in second.chat_pane.view.bubbles[-1].stats.text()


# --- the chat pane's keys and remembered settings (no engine needed) -------------------------------------------
def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    box = chat.pane.input
    assert chat.pane.enter_sends_box.isChecked() and "Enter to send" in box.placeholderText()
    QTest.keyClicks(box, "first line")
    QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(box, "second line")
    assert box.toPlainText() == "first line\nsecond line" and chat.bridge.requests == []
    with qtbot.waitSignal(chat.pane.send_requested) as sent:
        QTest.keyClick(box, Qt.Key.Key_Return)
    assert sent.args[0] == "first line\nsecond line" and box.toPlainText() == ""
    finish(chat)
    QTest.keyClicks(box, "keypad")
    with qtbot.waitSignal(chat.pane.send_requested):
        QTest.keyClick(box, Qt.Key.Key_Enter, Qt.KeyboardModifier.KeypadModifier)
    assert [r.messages[-1].content for r in chat.bridge.requests] == ["first line\nsecond line", "keypad"]


def test_with_enter_sends_off_enter_is_a_new_line_and_ctrl_enter_sends(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.pane.enter_sends_box.click()
    box = chat.pane.input
    assert not chat.pane.enter_sends_box.isChecked() and "Ctrl+Enter to send" in box.placeholderText()
    QTest.keyClicks(box, "one")
    QTest.keyClick(box, Qt.Key.Key_Return)
    QTest.keyClicks(box, "two")
    assert box.toPlainText() == "one\ntwo" and chat.bridge.requests == []
    with qtbot.waitSignal(chat.pane.send_requested) as sent:
        QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent.args[0] == "one\ntwo"
    finish(chat)
    box.setPlainText("\n  \n    def f():\n        return 1\n\n")     # pasted code keeps its first indent
    with qtbot.waitSignal(chat.pane.send_requested) as sent:
        QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent.args[0] == "    def f():\n        return 1"


def test_enter_does_not_send_while_a_reply_streams(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("first")
    QTest.keyClicks(chat.pane.input, "typed meanwhile")
    QTest.keyClick(chat.pane.input, Qt.Key.Key_Return)
    assert len(chat.bridge.requests) == 1 and chat.pane.input.toPlainText() == "typed meanwhile"


def test_sampling_settings_and_enter_sends_are_remembered_across_restarts(qtbot, tmp_path):
    ini = tmp_path / "strata.ini"
    first = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    box = first.pane.settings_box
    assert box.settings() == GenerationSettings()          # nothing stored yet: the defaults
    box.temperature.setValue(0.25)
    box.top_p.setValue(0.8)
    box.top_k.setValue(7)
    box.max_tokens.setValue(99)
    box.overflow.setCurrentIndex(box.overflow.findData("stop"))
    first.pane.enter_sends_box.click()
    first.prefs.settings.sync()                             # the window syncs its settings when it closes
    second = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert second.pane.settings_box.settings() == GenerationSettings(temperature=0.25, top_p=0.8, top_k=7,
                                                                     max_tokens=99, context_overflow="stop")
    assert not second.pane.enter_sends_box.isChecked() and not second.pane.input.enter_sends
    second.send("hi")
    assert second.bridge.requests[-1].settings.context_overflow == "stop"
    assert second.bridge.requests[-1].settings.max_tokens == 99


def test_settings_that_cannot_be_read_back_fall_back_to_the_defaults(qtbot, tmp_path):
    ini = tmp_path / "strata.ini"
    bad = QSettings(str(ini), QSettings.Format.IniFormat)
    for key, value in (("temperature", "hot"), ("top_k", "nan"), ("max_tokens", "1e999"),
                       ("context_overflow", "truncate"), ("enter_sends", "perhaps"), ("top_p", "0.5")):
        bad.setValue(f"chat/{key}", value)
    bad.sync()
    chat = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert chat.pane.settings_box.settings() == GenerationSettings(top_p=0.5)
    assert chat.pane.enter_sends_box.isChecked()
    # numbers a spin box cannot hold (past 32 bits; infinite) once made every start fail
    for key, value in (("top_k", "1e12"), ("max_tokens", str(2**40)), ("temperature", "inf"), ("top_p", "0.25")):
        bad.setValue(f"chat/{key}", value)
    bad.sync()
    again = make_chat(qtbot, tmp_path / "d", settings_file=ini)
    assert again.pane.settings_box.settings() == GenerationSettings(top_p=0.25)


def test_unsent_text_is_kept_across_a_restart(qtbot, tmp_path):
    ini = tmp_path / "strata.ini"
    first = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    QTest.keyClicks(first.pane.input, "a long prompt I have not sent yet")
    assert first.edits_timer.isActive() and first.edits_timer.interval() <= 1000
    first.edits_timer.timeout.emit()
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
    first.close()
    again = make_chat(qtbot, tmp_path / "c", settings_file=ini)
    assert again.current.id == b and again.pane.input.toPlainText() == "a thought for B"
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


def test_deleting_the_chat_shown_while_its_prompt_edit_is_pending_leaves_it_deleted(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Hello")
    finish(chat)
    gone = chat.current.id
    chat.pane.settings_box.system_prompt.setPlainText("Be brief.")      # kept a second later, not yet
    assert chat.edits_timer.isActive()
    chat.delete(gone)
    qtbot.wait(50)
    assert chat.library.find(gone) is None and chat.current.id != gone
    chat.library.close()
    assert not (tmp_path / "c" / f"{gone}.json").exists()


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


def test_the_system_prompt_is_hidden_and_ignored_in_completion_mode(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    box = chat.pane.settings_box
    box.setChecked(True)
    box.system_prompt.setPlainText("Answer in French.")
    assert box.form.isRowVisible(box.system_prompt) and box.system_prompt.isVisible()
    chat.send("Hello")
    assert [m.role for m in chat.bridge.requests[-1].messages] == ["system", "user"]
    finish(chat)
    chat.set_model(COMPLETION_MODEL)
    assert not box.form.isRowVisible(box.system_prompt) and not box.system_prompt.isVisible()
    assert box.title() == "Sampling" and "Completion mode" in chat.pane.mode_label.text()
    chat.send("Once upon a time")
    request = chat.bridge.requests[-1]
    assert request.prompt == "Once upon a time" and request.messages == ()
    assert chat.current.system_prompt == "Answer in French.", "the hidden text is kept for chat models"


def test_finish_reasons_under_a_reply_are_in_words(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    chat.pane.settings_box.max_tokens.setValue(64)
    for reason, tokens, error, words in (("length", 64, None, "reached max tokens"),
                                         ("length", 20, None, "context full"),
                                         ("abort", 3, None, "stopped by you"),
                                         ("stop", 9, None, "finished"),
                                         ("error", 0, "out of memory", "error: out of memory")):
        chat.send("Go")
        stream(chat, "text")
        finish(chat, reason, completion_tokens=tokens, error=error)
        line = chat.pane.view.bubbles[-1].stats.text()
        assert line.endswith(words) or f"· {words} ·" in line, line
        assert "stop:" not in line


def test_html_in_a_message_shows_as_the_text_it_is(qtbot):
    # Markdown renders, but a tag in the text (code, a reasoning tag, a styled span) is shown, never applied
    from PySide6.QtGui import QTextDocument

    from app.chat_view import BREAK, block_widget
    from app.markdown_blocks import split_all

    def shown(text: str) -> str:
        doc = QTextDocument()
        doc.setHtml("".join(block_widget(b).text() for b in split_all(text)))
        return doc.toPlainText().replace(BREAK, "")
    for text in ("if a<b and c>d then <b>x</b>", "Use vector<int> here", "the <think> tag",
                 "<script>alert(1)</script>after", "<span style='font-size:60px;color:red'>BIG</span>"):
        assert shown(text) == text
    assert shown("**bold** and `a<b`") == "bold and a<b"
    label = block_widget(split_all("plain words")[0])
    assert "<body>" in label.text() and "font-family" not in label.text().split("<body>")[1][:40]  # its own font


def test_a_long_word_wraps_inside_its_bubble_and_copies_whole(window, qtbot):
    # a URL, a hash or a long code line has break points where it is shown, so no bubble (and with it the
    # transcript) grows wider than the view; a copy of the selection leaves them out; links keep their address
    from PySide6.QtGui import QGuiApplication

    from app.chat_view import BREAK, block_widget, breakable, breakable_html, markdown_html
    from app.markdown_blocks import split_all
    url = "https://example.com/some/really/long/path/" + "abcdef0123456789" * 8 + "?q=1&r=2"
    assert BREAK in breakable(url) and breakable(url).replace(BREAK, "") == url
    assert breakable("short words stay as they are") == "short words stay as they are"
    for joined in ("x" + "\U0001f1eb\U0001f1f7" * 20, "\U0001f468\u200d\U0001f469\u200d\U0001f467" * 8,
                   "x" + "e\u0301" * 40, "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22" * 10):
        assert breakable(joined) == joined        # never inside a flag, an emoji sequence, an accent; Thai Qt breaks
    html = breakable_html(markdown_html(f"see <{url}>"))
    assert f'href="{url.replace("&", "&amp;")}"' in html and BREAK in html       # the address stays whole
    assert "&am" + BREAK not in html and "&" + BREAK not in html                  # never inside an entity
    for text in (f"see {url}", "```\n" + "x" * 300 + "\n```"):
        label = block_widget(split_all(text)[0])
        assert label.heightForWidth(300) > 0 and label.minimumSizeHint().width() < 300
    label = block_widget(split_all("```\n" + "y" * 100 + "\n```")[0])
    qtbot.addWidget(label)
    label.show()
    label.setSelection(0, len(label.text()))
    assert label.hasSelectedText()
    label.copy_selection()
    assert QGuiApplication.clipboard().text() == "y" * 100


def test_the_chat_menu_has_the_keys_a_chat_needs(window, qtbot):
    from PySide6.QtGui import QKeySequence
    actions = {a.shortcut().toString(): a for a in window.findChildren(type(window.menuBar().actions()[0]))
               if not a.shortcut().isEmpty()}
    assert {"Ctrl+N", "Esc", "Ctrl+R"} <= set(actions)
    _settings(window, max_tokens=4000)
    window.chat.send("And God said")
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        actions[QKeySequence("Esc").toString()].trigger()               # Esc stops the reply
    before = window.chat.current
    actions["Ctrl+N"].trigger()
    assert window.chat.current is not before and not window.chat.current.messages


def test_a_settings_file_that_cannot_be_written_is_said_once(qtbot, tmp_path):
    # unsent text and settings live in the settings file: when it cannot be written the window says so
    # (once), rather than losing them silently at the next crash
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    chat = make_chat(qtbot, tmp_path / "c", settings_file=blocked / "strata.ini")
    told: list[str] = []
    chat.prefs_error.connect(told.append)
    QTest.keyClicks(chat.pane.input, "typed")
    chat._keep_edits()
    chat._keep_edits()
    assert len(told) == 1 and str(blocked / "strata.ini") in told[0] and "kept only until Strata closes" in told[0]


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
    dialog.restore_button.click()                 # not now, and the dialog says why
    assert dialog.list.count() == 1 and dialog.why.text().startswith("A reply is being written")
    finish(chat)
    dialog.restore_button.click()
    assert dialog.list.count() == 0 and dialog.empty.isVisibleTo(dialog) and not dialog.restore_button.isEnabled()
    assert chat.current.id == gone and "Keep me for later" in bubble_texts(chat)
    chat.library.flush(10)
    assert (folder / f"{gone}.json").is_file() and not (folder / "trash" / f"{gone}.json").exists()
    again = make_chat(qtbot, folder)              # in the list after a restart too
    assert gone in [c.id for c in again.conversations] and again.trashed() == []


def test_control_characters_a_model_writes_show_as_symbols_and_are_kept(qtbot, tmp_path):
    from app.chat_view import shown
    assert shown("a\x1b[31mred\x00\x7f\tb\nc") == "a\u241b[31mred\u2400\u2421\tb\nc"
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Hi")
    stream(chat, "odd \x1b bytes \x10 here")
    finish(chat)
    labels = [w.text() for w in chat.pane.view.bubbles[-1].findChildren(QLabel)]
    assert any("odd \u241b bytes \u2410 here" in t for t in labels)
    assert chat.current.messages[-1].content == "odd \x1b bytes \x10 here"      # the message keeps them
