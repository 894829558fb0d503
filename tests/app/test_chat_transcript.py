"""The transcript: a long chat opens at once and offers its earlier messages, a huge or wide message stays
inside the view, what a model writes shows as the text it is (markup, control characters), finish reasons
are in words, and a chat exports as Markdown or JSON."""
from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QLabel

from tests.app.chat_fakes import exchange, finish, make_chat, stream


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


def test_show_earlier_messages_keeps_the_readers_place_and_a_message_sent_then_is_followed(qtbot, tmp_path,
                                                                                          monkeypatch):
    # the place was kept as a distance from the bottom once a batch, and each later change of the column
    # (the next batch, the offer's line going) moved the page under the reader by tens to hundreds of pixels
    import app.chat_controller as cc
    from app.conversations import Conversation, StoredMessage
    monkeypatch.setattr(cc, "SHOWN_MESSAGES", 40)
    chat = make_chat(qtbot, tmp_path / "c")
    chat.pane.resize(700, 700)
    n = 100
    long = Conversation(messages=[StoredMessage("user" if i % 2 == 0 else "assistant",
                                                f"message {i} " + "lorem ipsum " * (i % 13 + 1)) for i in range(n)])
    chat.library.save(long)
    chat.open(long.id)
    view = chat.pane.view
    qtbot.waitUntil(lambda: view.earlier_button.isVisibleTo(view), timeout=10_000)
    qtbot.wait(50)
    bar = view.verticalScrollBar()
    bar.triggerAction(bar.SliderAction.SliderToMinimum)          # the reader goes up to the offer
    first = view.bubbles[0]
    y = first.mapTo(view.viewport(), first.rect().topLeft()).y()
    view.earlier_button.click()
    qtbot.waitUntil(lambda: len(view.bubbles) == 80, timeout=10_000)
    qtbot.wait(100)
    assert abs(first.mapTo(view.viewport(), first.rect().topLeft()).y() - y) <= 2
    chat.send("A new question")                                   # the view follows the newest text again
    stream(chat, "An answer " * 40)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() and bar.maximum() > 0, timeout=5_000)


def test_earlier_messages_put_in_above_keep_the_readers_place(qtbot):
    from app.transcript import ChatView
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


def test_a_long_word_leaves_the_transcript_as_wide_as_its_view(qtbot):
    # one URL or long code line used to widen every bubble past the view (no horizontal scroll bar there)
    from app.transcript import ChatView
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

    from app.chat_view import SHOWN_CHARS
    from app.transcript import ChatView
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


def test_a_chat_exports_as_markdown_or_json_and_a_failed_export_leaves_nothing(qtbot, tmp_path):
    from app.chat_export import export_chat
    from app.conversations import Conversation
    chat = make_chat(qtbot, tmp_path / "c")
    chat.pane.settings_box.system_prompt.setPlainText("Be brief.")
    exchange(chat, "It is *blue*.", question="What colour is the sky?")
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
    text = "\n".join(line.rstrip(" ") for line in chat_markdown(conv).split("\n"))   # hard breaks aside
    assert text.count("\n## You\n") == 1 and "#### You\nnot a speaker" in text    # the user's own, two down
    assert "# a comment in code" in text and "\n###### deepest" in text          # code as written; at most six
    assert "## Assistant\n\n### Answer\ntext" in text


def test_line_breaks_inside_a_message_are_kept_in_the_markdown_as_on_screen():
    # The workbench shows each line break of a message (a poem, an address); Markdown would join the lines
    # of a paragraph, so the export ends each such line in a hard break, and code blocks stay as written
    from app.chat_export import chat_markdown
    from app.conversations import Conversation, StoredMessage
    conv = Conversation(title="Lines", system_prompt="Be brief.\nBe kind.", messages=[
        StoredMessage("user", "Line one\nLine two\n\nNew paragraph\n```\ncode a\ncode b\n```"),
        StoredMessage("assistant", "Roses\nViolets", reasoning="think\nmore")])
    text = chat_markdown(conv)
    assert "Line one  \nLine two\n\nNew paragraph" in text and "```\ncode a\ncode b\n```" in text
    assert "Be brief.  \nBe kind." in text and "Roses  \nViolets" in text and "> think  \n> more" in text


def test_a_scroll_away_while_the_transcript_is_still_laid_out_holds(qtbot):
    # scrolls to the bottom queued by a layout before the reader turned the wheel do not undo it
    from PySide6.QtWidgets import QApplication

    from app.transcript import ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    for i in range(40):
        view.add("user", f"message {i}")
    QApplication.processEvents()
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    view._range_changed(0, bar.maximum())            # a layout pass queues a scroll to the bottom...
    bar.setValue(bar.maximum() // 2)                  # ... and the reader scrolls up before it runs
    for _ in range(3):
        QApplication.processEvents()
    assert bar.value() == bar.maximum() // 2


def test_tab_reaches_an_earlier_message_put_in_above_before_the_ones_under_it(qtbot):
    from app.transcript import ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    first = view.add("user", "one")
    last = view.add("assistant", "three")
    middle = view.add("assistant", "two", before=last)        # filled in above, made last
    top = view.add("user", "zero", before=first)
    buttons = [b.copy_button for b in (top, first, middle, last)]
    seen, w = [], buttons[0]
    for _ in range(200):
        if w in buttons and w not in seen:
            seen.append(w)
        w = w.nextInFocusChain()
    assert seen == buttons


def test_a_message_label_sizes_itself_with_one_layout_at_the_width_it_is_given(qtbot):
    # a wrapped label's own hints lay its text out at several widths (a word to a line for the minimum), and
    # a new bubble was laid out at its default size before the transcript's: a long chat paid for each
    import app.chat_view as cv
    from app.transcript import ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    widths: list[int] = []
    measure = cv.QLabel.heightForWidth
    first = view.add("user", "word " * 3000)          # taller than the view: its scroll bar is up
    qtbot.waitUntil(lambda: first.isVisible() and view.verticalScrollBar().isVisible())
    try:
        cv.QLabel.heightForWidth = lambda label, width: widths.append(width) or measure(label, width)
        short, long = (view.add("user", "word " * n) for n in (3, 3000))
        qtbot.waitUntil(lambda: long.isVisible())
        laid_out = len(widths)
        for bubble in (short, long):
            label = next(w for w in bubble.findChildren(QLabel) if w.wordWrap() and w.text().strip())
            assert label.sizeHint().height() > 0 and len(widths) == laid_out      # lays no text out itself
            assert label.minimumSizeHint().height() == label.fontMetrics().height()
    finally:
        cv.QLabel.heightForWidth = measure
    # each at most once at each width the scroll area tries: the view's, less its scroll bar and not
    assert len(widths) <= 4 and max(widths) - min(widths) in (0, view.verticalScrollBar().width())


def test_a_message_put_in_above_a_long_chat_or_a_growing_reply_resizes_no_other_message(qtbot):
    # a layout pass used to squeeze every message below a new one and stretch it back: each message put on
    # screen laid out every one of a long chat again (200 ms a slice at 800 messages)
    from PySide6.QtCore import QEvent, QObject
    from app.chat_view import MessageBubble
    from app.transcript import PAGE_BUBBLES, ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    text = "A sentence of a few words that wraps in the bubble's width. " * 6
    for i in range(3 * PAGE_BUBBLES):
        view.add("assistant" if i % 2 else "user", text)
    qtbot.waitUntil(lambda: all(b.isVisible() for b in view.bubbles))
    qtbot.wait(50)
    resized: list[QObject] = []

    class Resizes(QObject):
        def eventFilter(self, watched, event):
            if event.type() == QEvent.Type.Resize and isinstance(watched, MessageBubble):
                resized.append(watched)
            return False

    counter = Resizes()
    for b in view.bubbles:
        b.installEventFilter(counter)
    older = list(view.bubbles)
    view._follow = False
    for _ in range(PAGE_BUBBLES + 2):                       # through a full page into a new one
        new = view.add("user", text, before=view.bubbles[0])
        qtbot.waitUntil(new.isVisible)
    streaming = view.add("assistant", "", streaming=True)
    qtbot.waitUntil(streaming.isVisible)
    for _ in range(5):
        streaming.append(text + "\n\n")
        qtbot.wait(20)
    assert streaming.height() > 200 and not [b for b in resized if b in older]
    assert [b.text for b in view.bubbles[-3 * PAGE_BUBBLES - 1:-1]] == [b.text for b in older]


def test_messages_put_in_mid_page_keep_every_page_at_most_full_and_the_order(qtbot):
    from app.transcript import PAGE_BUBBLES, ChatView
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    for i in range(2 * PAGE_BUBBLES):
        view.add("user", f"m{i}")
    expected = [f"m{i}" for i in range(2 * PAGE_BUBBLES)]
    for n in range(PAGE_BUBBLES + 3):            # notices above a bubble in the middle of the first page
        at = 3 + n % 5
        view.add("notice", f"n{n}", before=view.bubbles[at])
        expected.insert(at, f"n{n}")
    pages = list(view._pages)
    assert all(p.layout().count() <= PAGE_BUBBLES for p in pages)
    shown = [p.layout().itemAt(j).widget().text for p in pages for j in range(p.layout().count())]
    assert shown == [b.text for b in view.bubbles] == expected


def test_tab_goes_through_the_messages_in_reading_order_before_what_lies_below_them(qtbot):
    # Qt chains a widget made later at the window's end: a new message's buttons came after every dock
    from PySide6.QtWidgets import QPushButton, QVBoxLayout, QWidget
    from app.transcript import ChatView
    window = QWidget()
    qtbot.addWidget(window)
    lay = QVBoxLayout(window)
    view = ChatView()
    below = QPushButton("Send")                      # what the pane has under the transcript
    lay.addWidget(view)
    lay.addWidget(below)
    window.show()
    first = view.add("user", "one")
    second = view.add("assistant", "two")
    second.set_pager(1, 2)                          # "‹ 2/2 ›" and Delete, made now, shown before Copy
    third = view.add("assistant", "three")
    third.set_reasoning("thinking")                 # its block, made now, comes after its Copy
    late = QPushButton("a dock's button, made after the messages")
    lay.addWidget(late)
    fourth = view.add("user", "four")
    expected = [first.copy_button, second.prev_button, second.next_button, second.delete_version_button,
                second.copy_button, third.copy_button, third.reasoning.toggle, fourth.copy_button, below, late]
    order, w = [], view
    while (w := w.nextInFocusChain()) is not view:
        if w in expected:
            order.append(w)
    assert order == expected, [getattr(x, "text", lambda: "")() for x in order]
