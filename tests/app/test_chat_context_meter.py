"""The context meter: how much of the model's context the chat shown takes, what was left out to fit it, and
the count saved with the chat, read back after a restart and after a crash mid-reply. The tests play the
bridge (see chat_fakes)."""
from __future__ import annotations

from app.messages import ContextUsage
from tests.app.chat_fakes import CHAT_MODEL, SEEN, bubble_texts, finish, make_chat, on_disk, stream


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
    first.stream_saves.timer.timeout.emit()
    assert first.pane.context_meter.label.text() == "Context 12 / 512 tokens"     # it grows as the reply is saved
    stream(first, SEEN[20:], used_tokens=177)
    first.stream_saves.timer.timeout.emit()
    assert on_disk(first)["context_used"] == 177
    # the process dies here: no on_finished, no close
    again = make_chat(qtbot, tmp_path / "c")
    assert again.pane.view.bubbles[-1].text == SEEN
    assert again.pane.context_meter.label.text() == "Context 177 / 512 tokens"


def test_a_reply_asked_again_or_edited_away_takes_its_note_off_the_screen(qtbot, tmp_path):
    note = "3 earlier messages left out"
    chat = make_chat(qtbot, tmp_path / "c")
    chat.send("Q1")
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100, dropped_messages=3, note=note))
    stream(chat, "B.")
    finish(chat)
    assert note in bubble_texts(chat)
    chat.regenerate()                       # this request leaves nothing out: no note
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100))
    stream(chat, "C.")
    finish(chat)
    assert note not in bubble_texts(chat)
    chat.regenerate()                       # one that does says so once
    chat.on_context(ContextUsage(chat.live_id, 300, 512, 100, dropped_messages=3, note=note))
    stream(chat, "D.")
    finish(chat)
    assert bubble_texts(chat).count(note) == 1
    chat.edit_last()                        # the message and its reply go back to the box: so does the note
    assert bubble_texts(chat) == []
    chat.open(chat.current.id)              # and it is not shown again when the chat is shown again
    assert bubble_texts(chat) == []
