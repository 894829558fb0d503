"""The workbench's pure logic: Markdown block splitting, reply stats, thermal states, the store."""
from __future__ import annotations

import json

from app.conversations import Conversation, ConversationStore, StoredMessage
from app.gpu_poller import GpuSample
from app.markdown_blocks import split_all, split_finished
from app.messages import CONTEXT_OVERFLOW_POLICIES, GenerationSettings, ReplyStats
from app.reply_tracker import ReplyTracker
from app.thermal import AMBER, OK, RED, UNKNOWN, ThermalGuard, assess


def test_streamed_markdown_renders_only_finished_blocks():
    blocks, tail = split_finished("First para\nstill first\n\nSecond par")
    assert [b.text for b in blocks] == ["First para\nstill first"] and tail == "Second par"
    blocks, tail = split_finished("Intro\n```python\ndef f():\n    return 1\n")
    assert [b.kind for b in blocks] == [] and tail.startswith("Intro")     # code fence still open
    blocks, tail = split_finished("Intro\n```python\ndef f():\n    return 1\n```\nafter")
    assert [(b.kind, b.lang) for b in blocks] == [("markdown", ""), ("code", "python")]
    assert blocks[1].text == "def f():\n    return 1" and tail == "after"
    assert [b.kind for b in split_all("text\n```\nunterminated code")] == ["markdown", "code"]


def test_reply_tracker_measures_ttft_speeds_and_hit_rate():
    t = ReplyTracker()
    t.start("r", "chat", hits=100, misses=50, now=10.0)
    t.on_tokens("r", 1, prompt_tokens=40, completion_tokens=1, ttft_ms=200.0, now=10.2)
    t.on_tokens("r", 10, prompt_tokens=40, completion_tokens=11, ttft_ms=None, now=11.2)
    s = t.finish("r", "length", hits=190, misses=60, now=11.2)
    assert s.ttft_ms == 200.0 and s.prompt_tok_s == 200.0
    assert abs(s.decode_tok_s - 10.0) < 1e-9 and s.expert_hit_rate == 0.9
    assert "reached max tokens" in s.summary() and "expert hits 90.0%" in s.summary()
    assert "stop:" not in s.summary()
    assert t.finish("r", "stop", 0, 0, 12.0) is None


def test_finish_reasons_are_said_in_words():
    def stats(reason: str, tokens: int = 5, error: str | None = None) -> ReplyStats:
        return ReplyStats("r", "chat", reason, completion_tokens=tokens, error=error)

    assert stats("stop").finish_words() == "finished"
    assert stats("length", 64).finish_words(max_tokens=64) == "reached max tokens"
    assert stats("length", 64).finish_words() == "reached max tokens"      # the limit not known: the usual cause
    # the engine also ends a reply that fills the context as "length": fewer tokens than asked for says which
    assert stats("length", 20).finish_words(max_tokens=64) == "context full"
    assert stats("abort").finish_words() == "stopped by you"
    assert stats("error", error="the model was closed").finish_words() == "error: the model was closed"
    assert stats("error").finish_words() == "error: the reply failed"
    line = stats("error", error="out of memory").summary(max_tokens=64)
    assert line.endswith("5 tokens · error: out of memory") and "stop:" not in line
    # refused before its first token (a chat too long): only why, not "TTFT — · decode — · 0 tokens"
    assert stats("error", 0, error="the conversation needs 90 tokens").summary() == \
        "error: the conversation needs 90 tokens"


def test_a_failed_reply_says_so_in_red_under_it(qapp):
    from app.chat_view import MessageBubble
    bubble = MessageBubble("assistant", "half", streaming=True)
    bubble.finish("TTFT 12 ms · decode 50.0 tok/s · 5 tokens · error: out of memory")
    assert bubble.stats.objectName() == "replyError"
    bubble.show_text("another version", "TTFT 12 ms · decode 50.0 tok/s · 5 tokens · finished")
    assert bubble.stats.objectName() == "replyStats"
    bubble.show_text("", "error: the conversation needs 90 tokens")
    assert bubble.stats.objectName() == "replyError"


def test_overflow_policy_names_match_the_engine():
    from engine.context import OVERFLOW_POLICIES
    assert CONTEXT_OVERFLOW_POLICIES == OVERFLOW_POLICIES and GenerationSettings().context_overflow in OVERFLOW_POLICIES


def test_thermal_assessment_keeps_since_and_guard_has_hysteresis():
    base = GpuSample(timestamp=100.0, gpu_temp_c=70.0, slowdown_temp_c=90.0, throttle_reasons=())
    assert assess(base).level == OK
    assert assess(GpuSample(timestamp=0.0, available=False)).level == UNKNOWN
    warm = assess(base.with_changes(throttle_reasons=("software power cap",)))
    assert warm.level == AMBER and warm.since == 100.0
    later = assess(base.with_changes(timestamp=130.0, throttle_reasons=("hardware power brake",)), warm)
    assert later.level == RED and later.since == 100.0
    guard = ThermalGuard(pause_at_c=80, resume_below_c=70, enabled=True)
    assert guard.update(base.with_changes(gpu_temp_c=81.0)).action == "pause"
    assert guard.update(base.with_changes(gpu_temp_c=75.0)) is None
    assert guard.update(base.with_changes(gpu_temp_c=69.0)).action == "resume"


def test_store_round_trip(tmp_path):
    store = ConversationStore(tmp_path / "c")
    conv = Conversation(title="t", system_prompt="be brief", messages=[StoredMessage("user", "hi")])
    store.save(conv)
    loaded = store.load_all()
    assert loaded.problems == []
    convs = loaded.conversations
    assert len(convs) == 1 and convs[0].messages[0].content == "hi" and convs[0].system_prompt == "be brief"
    assert json.loads(store.path_of(conv.id).read_text())["version"] == 2


def test_collapsed_sampling_box_says_what_is_in_force(qtbot):
    from app.chat_pane import SettingsBox
    box = SettingsBox()
    qtbot.addWidget(box)
    assert not box.isChecked() and box.summary.isVisibleTo(box) and not box.contents.isVisibleTo(box)
    box.set_settings(GenerationSettings(temperature=0.0, top_p=0.9, top_k=40, max_tokens=64))
    assert box.summary.text() == "greedy · top-p 0.9 · top-k 40 · at most 64 tokens (tick to change)"
    box.set_reasoning_shown(True)
    box.system_prompt.setPlainText("Be brief.")
    assert "reasoning medium" in box.summary.text() and "system prompt set" in box.summary.text()
    box.set_system_prompt_shown(False)            # completion mode: no system prompt to speak of
    assert "system prompt" not in box.summary.text()
    box.setChecked(True)
    assert box.contents.isVisibleTo(box) and not box.summary.isVisibleTo(box)


def test_a_load_test_says_when_it_was_stopped_and_which_reading_is_its_own(qapp):
    from app.load_test import LoadTestDialog, summarise
    from engine.telemetry import EngineStats
    sent, cancelled = [], []
    dialog = LoadTestDialog(sent.append, cancelled.append)
    dialog.set_context(512)
    dialog.prompt_len.setValue(16)
    dialog.output_len.setValue(2000)                        # past the context: said before Start
    assert dialog.fit_note.isVisibleTo(dialog) and "2,016 tokens) are more than the model's 512" in \
        dialog.fit_note.text()
    dialog.output_len.setValue(400)
    assert dialog.fit_note.isHidden()
    dialog.streams.setValue(2)
    dialog.start()
    dialog.on_stats(EngineStats(batch_size=8, running=8, aggregate_tok_s=238.7))
    first = [ReplyStats(rid, "loadtest", "abort", completion_tokens=30, started=0.0, finished=1.0, decode_tok_s=40.0)
             for rid in dialog.ids]
    for r in first:
        dialog.on_finished(r)
    assert dialog.summary.text().startswith("Stopped: every stream ended early.")
    assert summarise(first).stopped == 2
    dialog.start()                                          # no reading arrives during this one
    assert dialog.live.text() == "Engine aggregate: —"
    error = "the server answered 400: prompt and max_tokens are 1 token over the 512-token context; shorten it"
    for rid in dialog.ids:
        dialog.on_finished(ReplyStats(rid, "loadtest", "error", error=error, started=0.0, finished=0.1))
    assert "238.7" not in dialog.live.text()
    assert dialog.table.item(0, 1).toolTip() == f"error: {error}"             # the whole error, where it is cut
