"""Chat against the real engine on the demo model: streaming, stop, regenerate/edit, restart, a crash while a
reply streams, the chat menu's keys, and a long word in a bubble."""
from __future__ import annotations

import json
import shutil

from app.chat_controller import INTERRUPTED_NOTE
from app.messages import GenerationSettings, TextBatch
from app.paths import default_model_dir, read_demo_marker
from tests.app.chat_fakes import make_chat

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
    line = window.chat_pane.notice.text()
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


def test_a_message_shows_its_line_breaks(qtbot):
    # Markdown joins the lines of a paragraph: a poem, an address or a stack trace would read as one line
    from PySide6.QtGui import QTextDocument

    from app.chat_view import MessageBubble

    def shown_lines(html: str) -> list[str]:
        doc = QTextDocument()
        doc.setHtml(html)
        return doc.toPlainText().split("\n")

    for role in ("user", "assistant"):
        text = "Roses are red\nViolets are blue\n\n- one\n- two\n  still two\n\n    code\n    more"
        bubble = MessageBubble(role, text)
        qtbot.addWidget(bubble)
        lines = [line for w in bubble._blocks for line in shown_lines(w.text())]
        assert lines[:2] == ["Roses are red", "Violets are blue"]
        assert "two" in lines and "still two" in lines        # not "two still two"
        assert "code  " not in lines and bubble.text.startswith("Roses are red\nViolets")      # kept as written


def test_text_with_windows_line_ends_keeps_its_table_and_lines():
    from app.markdown_text import hard_breaks
    assert hard_breaks("| a | b |\r\n|---|---|\r\n| 1 | 2 |") == "| a | b |  \n|---|---|  \n| 1 | 2 |"
    assert hard_breaks("one\rtwo") == "one  \ntwo"


def test_a_block_quote_is_marked_as_one_not_read_as_the_list_above_it(qapp):
    from PySide6.QtGui import QTextDocument

    from app.markdown_text import QUOTE_BAR, markdown_html
    doc = QTextDocument()
    doc.setHtml(markdown_html("1. first\n2. second\n\n> quoted one\n> quoted two\n>> nested\n\nafter"))
    lines = doc.toPlainText().split("\n")
    assert f"{QUOTE_BAR} quoted one" in lines and f"{QUOTE_BAR * 2} nested" in lines
    assert "after" in lines and "second" in lines


def test_a_reply_of_the_real_engine_goes_on_while_another_chat_is_open(window, qtbot):
    _settings(window, max_tokens=120)
    window.chat.new_chat()
    window.chat.send("And God said")
    writing = window.chat.current.id
    qtbot.waitUntil(lambda: bool(window.chat.live.text), timeout=REPLY_MS)
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS) as done:
        window.chat.new_chat()                           # the user goes on elsewhere while it is written
        assert window.chat.live is not None and window.chat.live_bubble is None
    assert done.args[0].completion_tokens > 0
    assert window.chat_pane.view.bubbles == []           # the new chat shows none of it
    window.chat.open(writing)
    reply = window.chat.current.messages[-1]
    assert window.chat_pane.view.bubbles[-1].text == reply.content != "" and not reply.interrupted


def test_a_stored_message_makes_only_the_widgets_it_shows(qapp):
    # a long chat makes a bubble per message: no streaming tail, reasoning block or pager where none is used
    from app.chat_view import MessageBubble
    bubble = MessageBubble("assistant", "A stored reply.")
    assert bubble._tail is None and bubble._reasoning is None and bubble._pager is None
    bubble.set_pager(0, 1)
    bubble.set_reasoning("")
    assert bubble._pager is None and bubble._reasoning is None
    bubble.set_pager(1, 2)
    assert bubble.pager_label.text() == "2/2" and bubble.prev_button.isEnabled()
    streaming = MessageBubble("assistant", streaming=True)
    streaming.append("partial")
    assert streaming.tail.text() == "partial"


def test_every_menu_item_has_an_access_key_and_the_chat_menu_edits_and_renames(window, qtbot):
    from PySide6.QtWidgets import QMenu
    for menu in window.menuBar().findChildren(QMenu):
        keys = []
        for action in menu.actions():
            if not action.isSeparator():
                text = action.text().replace("&&", "")
                assert "&" in text, f"{menu.title()} › {action.text()} has no access key"
                keys.append(text[text.index("&") + 1].lower())
        assert len(keys) == len(set(keys)), f"{menu.title()}: two items share an access key: {keys}"
    chat = next(m for m in window.menuBar().findChildren(QMenu) if m.title() == "&Chat")
    items = {a.text(): a for a in chat.actions()}
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat.send("The Lord is my shepherd")
    window.chat.ask_text = lambda _title, _label, _text: "Psalms"
    items["Rena&me this chat…"].trigger()
    assert window.chat.current.title == "Psalms"
    window.chat.confirm = lambda _title, _question: True          # "... its reply is removed": yes
    items["Edit the &last message"].trigger()
    assert window.chat_pane.input.toPlainText() == "The Lord is my shepherd"


def test_the_chat_menu_greys_out_what_cannot_apply_while_it_is_open(window, qtbot):
    from PySide6.QtCore import QPoint
    menu = window.chat_menu
    items = (menu.stop, menu.regenerate, menu.edit_last, menu.rename)
    menu.menu.popup(window.mapToGlobal(QPoint(40, 40)))     # a new chat: nothing to stop, redo, edit or rename
    qtbot.waitUntil(menu.menu.isVisible)
    qtbot.wait(20)
    assert [a.isEnabled() for a in items] == [False, False, False, False]
    assert menu.new.isEnabled() and menu.search.isEnabled() and menu.trash.isEnabled()
    menu.menu.hide()                # closed: the shortcuts work again whatever the state
    assert all(a.isEnabled() for a in items)
    menu.menu.aboutToShow.emit()    # asked to show but never shown (a global menu reading it): enabled at once
    assert not menu.stop.isEnabled()
    qtbot.waitUntil(lambda: all(a.isEnabled() for a in items))
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat.send("Hello there")
    menu.grey_out()                 # a saved chat with a reply: all but Stop apply
    assert [a.isEnabled() for a in items] == [False, True, True, True]
    menu.enable_all()
    window.chat.regenerate()        # a reply in flight in the shown chat: only Stop applies
    assert window.chat.live is not None
    menu.grey_out()
    assert [a.isEnabled() for a in items] == [True, False, False, True]
    menu.enable_all()
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        menu.stop.trigger()
