"""Chat against the real engine on the demo model: streaming, stop, regenerate/edit, restart."""
from __future__ import annotations

import json

from app.messages import GenerationSettings, TextBatch
from app.paths import default_model_dir, read_demo_marker

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
    assert "TTFT" in line and "tok/s" in line and f"{stats.completion_tokens} tokens" in line
    assert window.chat_pane.send_button.isEnabled() and not window.chat_pane.stop_button.isEnabled()
    # the demo is a small completion model: the window says so, and whether its weights are random
    marker = read_demo_marker(default_model_dir())
    assert "Completion mode" in window.chat_pane.mode_label.text()
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
    assert "stop: abort" in bubble.stats.text()


def test_regenerate_and_edit_last(window, qtbot):
    _settings(window, max_tokens=6)
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat.send("Blessed are the meek")
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat_pane.regen_button.click()
    roles = [m.role for m in window.chat.current.messages]
    assert roles == ["user", "assistant"], "regenerate replaces the reply instead of adding one"
    window.chat_pane.edit_button.click()
    assert window.chat.current.messages == []
    assert window.chat_pane.input.toPlainText() == "Blessed are the meek"
    assert len(window.chat_pane.view.bubbles) == 0


def test_conversations_survive_a_restart(window_factory, qtbot, tmp_path):
    first = window_factory()
    _settings(first, max_tokens=8)
    with qtbot.waitSignal(first.chat.reply_done, timeout=REPLY_MS):
        first.chat.send("The Lord is my shepherd")
    reply = first.chat.current.messages[-1].content
    conv_id = first.chat.current.id
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
