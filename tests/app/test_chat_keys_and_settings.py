"""The chat pane's keys (Enter sends, or Ctrl+Enter when that is off) and its remembered settings: sampling
settings across restarts, values that cannot be read back, a settings file that cannot be written, the
system prompt in completion mode. A recording bridge stands in for the engine (see chat_fakes)."""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest

from app.messages import GenerationSettings
from tests.app.chat_fakes import COMPLETION_MODEL, finish, make_chat


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


def test_tab_leaves_the_message_box_for_the_buttons(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c")
    box = chat.pane.input
    box.setFocus()
    QTest.keyClicks(box, "a question")
    QTest.keyClick(box, Qt.Key.Key_Tab)
    assert box.toPlainText() == "a question"          # no tab typed into it: the focus moves on, as in a form
    box.insertPlainText("\tpasted\ttext")              # pasted text keeps its tabs
    assert "\tpasted" in box.toPlainText()
