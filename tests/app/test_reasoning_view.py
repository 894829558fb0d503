"""A reasoning model in the workbench: its thinking streams into a collapsible "Reasoning" block above the
answer, is saved with the reply (a crash mid-reply keeps it like the answer), comes back with each version
of a reply, and the reasoning effort is a chat setting sent with each request and remembered."""
from __future__ import annotations

from dataclasses import replace

from harmony_model import build_tiny_harmony_tokenizer
from PySide6.QtCore import Qt

from app.messages import REASONING_EFFORTS, TextBatch, TextChunk
from app.reply_text import ReplyText
from engine.chat_format.harmony import EFFORTS
from engine.outputs import RequestDelta
from engine.tokenizer import Tokenizer
from tests.app.chat_fakes import CHAT_MODEL, finish, make_chat, on_disk, stream

REASONING_MODEL = replace(CHAT_MODEL, reasons=True)
THOUGHT = "The user says hello; greet them back."


def think(chat, text: str) -> None:
    chat.on_text(TextBatch((TextChunk(chat.live_id, "", text),)))


def test_the_effort_names_are_the_engines():
    assert REASONING_EFFORTS == EFFORTS


def test_reasoning_streams_into_a_collapsed_block_above_the_answer(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c", model=REASONING_MODEL)
    chat.send("hi")
    bubble = chat.live_bubble
    assert not bubble.reasoning.isVisibleTo(bubble)                   # nothing thought yet: no block
    think(chat, THOUGHT[:10])
    think(chat, THOUGHT[10:])
    stream(chat, "Hello!")
    block = bubble.reasoning
    assert block.isVisibleTo(bubble) and block.text == THOUGHT and bubble.text == "Hello!"
    assert not block.label.isVisibleTo(bubble) and not block.expanded              # collapsed by default
    layout = bubble.layout()
    assert layout.indexOf(block) < layout.indexOf(bubble.tail)              # above the answer
    block.toggle.click()
    assert block.label.isVisibleTo(bubble) and block.label.text() == THOUGHT
    assert block.toggle.arrowType() == Qt.ArrowType.DownArrow
    block.toggle.click()
    assert not block.label.isVisibleTo(bubble)
    finish(chat)
    reply = on_disk(chat)["messages"][1]
    assert (reply["content"], reply["reasoning"], reply["interrupted"]) == ("Hello!", THOUGHT, False)
    bubble.copy()                                                            # the copy is the answer only


def test_a_crash_mid_reasoning_keeps_what_was_thought_and_a_restart_shows_it(qtbot, tmp_path):
    folder = tmp_path / "c"
    first = make_chat(qtbot, folder, model=REASONING_MODEL)
    first.send("hi")
    think(first, THOUGHT)
    first.stream_saves.timer.timeout.emit()
    reply = on_disk(first)["messages"][1]
    assert (reply["reasoning"], reply["content"], reply["interrupted"]) == (THOUGHT, "", True)
    second = make_chat(qtbot, folder, model=REASONING_MODEL)         # the process died: a fresh start
    bubble = second.pane.view.bubbles[-1]
    assert bubble.reasoning.isVisibleTo(bubble) and bubble.reasoning.text == THOUGHT
    second.regenerate()
    assert not bubble.reasoning.isVisibleTo(bubble)                           # the new version starts empty
    think(second, "Another thought.")
    stream(second, "Hi there.")
    finish(second)
    saved = on_disk(second)["messages"][1]
    assert [(a["reasoning"], a["content"]) for a in saved["alternatives"]] == [(THOUGHT, ""),
                                                                                ("Another thought.", "Hi there.")]
    bubble.prev_button.click()
    assert bubble.reasoning.text == THOUGHT
    bubble.next_button.click()
    assert bubble.reasoning.text == "Another thought." and bubble.text == "Hi there."


def test_the_effort_is_a_chat_setting_sent_with_requests_and_remembered(qtbot, tmp_path):
    settings = tmp_path / "settings.ini"
    chat = make_chat(qtbot, tmp_path / "c", settings, model=CHAT_MODEL)
    box = chat.pane.settings_box
    box.setChecked(True)
    assert not box.effort.isVisibleTo(box)                                 # not a reasoning model: no setting
    chat.set_model(REASONING_MODEL)
    assert box.effort.isVisibleTo(box)
    box.effort.setCurrentIndex(box.effort.findData("high"))
    chat.send("hi")
    assert chat.bridge.requests[-1].settings.reasoning_effort == "high"
    finish(chat)
    chat.close()
    again = make_chat(qtbot, tmp_path / "c2", settings, model=REASONING_MODEL)
    assert again.pane.settings_box.settings().reasoning_effort == "high"


def test_the_bridge_reads_a_reasoning_models_tokens_into_reasoning_and_answer(tmp_path):
    tok = Tokenizer.from_dir(build_tiny_harmony_tokenizer(tmp_path))
    ids = tok.encode(f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final"
                     "<|message|>Hello!<|return|>", add_special_tokens=False)
    text = ReplyText()
    text.read_apart("r1", tok.harmony.reader())
    half = len(ids) // 2
    text.add(RequestDelta("r1", tuple(ids[:half]), "garbled", False))
    text.add(RequestDelta("plain", (5,), "plain text", False))       # another request: its text as is
    text.add(RequestDelta("r1", tuple(ids[half:]), "garbled", True, "stop"))
    batch = text.take()
    chunks = {c.request_id: c for c in batch.chunks}
    assert (chunks["r1"].reasoning, chunks["r1"].text) == (THOUGHT, "Hello!")
    assert (chunks["plain"].reasoning, chunks["plain"].text) == ("", "plain text")
    assert text.take() is None


def test_the_bridge_reads_think_tags_into_reasoning_and_answer(tmp_path):
    # Qwen3 / GLM-4.5: the reply opens a <think> block; the window shows it as the reasoning above the answer
    from app.bridge_api import reasoning_reader
    from tiny_models import build_tiny_think_model
    tok = Tokenizer.from_dir(build_tiny_think_model(tmp_path / "think"))
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    reader = reasoning_reader(tok, prompt)
    ids = [tok.think.open_id, *tok.encode("\nLet me see.\n", add_special_tokens=False), tok.think.close_id,
           *tok.encode("\n\nHello!", add_special_tokens=False)]
    text = ReplyText()
    text.read_apart("r1", reader)
    text.add(RequestDelta("r1", tuple(ids[:3]), "x", False))
    text.add(RequestDelta("r1", tuple(ids[3:]), "x", True, "stop"))
    chunk = text.take().chunks[0]
    assert (chunk.reasoning, chunk.text) == ("Let me see.\n", "Hello!")
    assert reasoning_reader(Tokenizer.from_dir(build_tiny_harmony_tokenizer(tmp_path / "h")), []) is not None


def test_a_long_thought_streams_without_laying_itself_out_again(qtbot):
    # each batch is added at the end of the laid-out text; past SHOWN_CHARS the rest is counted, not shown
    from app.chat_view import SHOWN_CHARS, MessageBubble
    bubble = MessageBubble("assistant", streaming=True)
    qtbot.addWidget(bubble)
    block = bubble.reasoning
    block.toggle.click()
    edits = []
    block.label.document().contentsChange.connect(lambda at, removed, added: edits.append((at, removed)))
    pieces = ["the th", "ought goes ", "on and on. "] * 2000
    for piece in pieces:
        block.append(piece)
    assert block.text == "".join(pieces) and len(block.text) > SHOWN_CHARS
    assert all(removed == 0 for _, removed in edits), "nothing laid out is replaced while it streams"
    assert block.label.text() == block.text[:SHOWN_CHARS]
    assert block.toggle.text().startswith(f"Reasoning ({len(block.text.split()):,} words; the last ")
    block.set_text("A short one.")
    assert block.toggle.text() == "Reasoning (3 words)" and block.label.text() == "A short one."


def test_a_reply_that_only_reasoned_stays_a_turn_of_the_model_in_the_next_request(qtbot, tmp_path):
    # left out, the next prompt would hold two user messages one after the other
    chat = make_chat(qtbot, tmp_path / "c", model=REASONING_MODEL)
    chat.send("hi")
    think(chat, THOUGHT)
    finish(chat, reason="length")
    chat.send("again")
    sent = [(m.role, m.content) for m in chat.bridge.requests[-1].messages]
    assert sent == [("user", "hi"), ("assistant", ""), ("user", "again")]


def test_the_reasoning_toggle_counts_one_word_as_one(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c", model=REASONING_MODEL)
    chat.send("hi")
    think(chat, "Hmm.")
    assert chat.live_bubble.reasoning.toggle.text() == "Reasoning (1 word)"
    think(chat, " Right.")
    assert chat.live_bubble.reasoning.toggle.text() == "Reasoning (2 words)"


def test_a_reply_that_ended_in_its_reasoning_says_it_gave_no_answer(qtbot, tmp_path):
    chat = make_chat(qtbot, tmp_path / "c", model=REASONING_MODEL)
    chat.send("hi")
    bubble = chat.live_bubble
    think(chat, THOUGHT)
    finish(chat, reason="length")
    assert bubble.stats.text().endswith(" · no answer: the reply ended in its reasoning")
    assert on_disk(chat)["messages"][-1]["stats"].endswith("no answer: the reply ended in its reasoning")
    chat.send("again")
    think(chat, THOUGHT)
    stream(chat, "Hello!")
    finish(chat)
    assert "no answer" not in on_disk(chat)["messages"][-1]["stats"]
