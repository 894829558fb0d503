"""The chat's message bubbles (app/transcript.py holds them in a column): a streaming reply shows plain
text and turns each finished Markdown block (paragraph, list, fenced code) into rendered text once, never
re-rendering the whole reply."""
from __future__ import annotations

import math
import re

from PySide6.QtCore import QSize, QSizeF, Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QKeySequence, QTextCursor, QTextOption
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QTextEdit,
                               QToolButton, QVBoxLayout, QWidget)

from app.markdown_blocks import Block, split_all, split_finished
from app.markdown_text import markdown_html

_SELECTABLE = Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse


class _WrappedLabel(QLabel):
    """A word-wrapped label that remembers its height at each width: the transcript's layout asks every
    bubble again whenever the streaming reply grows a line, and a rich-text label lays its text out anew
    on each ask, so a long chat would spend each new line re-measuring all the ones above it."""

    def __init__(self) -> None:
        super().__init__()
        self._heights: dict[int, int] = {}

    def heightForWidth(self, width: int) -> int:
        height = self._heights.get(width)
        if height is None:
            if len(self._heights) > 8:
                self._heights.clear()
            height = self._heights[width] = super().heightForWidth(width)
        return height

    def setText(self, text: str) -> None:
        self._heights.clear()
        super().setText(text)

    def sizeHint(self) -> QSize:
        # a wrapped label's own hint lays its text out at several widths in search of a pleasing shape, and
        # even one layout at a hint width is one more than needed: the transcript's layouts size it by its
        # height at the bubble's width (heightForWidth). 80 characters wide, as QLabel starts with, and the
        # last height measured (a line before any)
        width = self.fontMetrics().averageCharWidth() * 80
        height = next(reversed(self._heights.values()), None) if self._heights else None
        return QSize(width, height if height is not None else self.fontMetrics().height())

    def minimumSizeHint(self) -> QSize:
        # its own lays the text out a word to a line; the transcript breaks long words itself (breakable)
        return QSize(self.fontMetrics().averageCharWidth() * 4, self.fontMetrics().height())

    def changeEvent(self, event) -> None:       # a font or style change lays the text out differently
        self._heights.clear()
        super().changeEvent(event)

    def keyPressEvent(self, event) -> None:
        if event.matches(QKeySequence.StandardKey.Copy) and self.hasSelectedText():
            self.copy_selection()
            return
        super().keyPressEvent(event)

    def contextMenuEvent(self, event) -> None:
        if not self.hasSelectedText():
            super().contextMenuEvent(event)
            return
        from PySide6.QtWidgets import QMenu
        menu = QMenu(self)
        menu.addAction("Copy", self.copy_selection)
        menu.exec(event.globalPos())

    def copy_selection(self) -> None:
        """The selected text as it was written: without the break points a long word is shown with."""
        QGuiApplication.clipboard().setText(self.selectedText().replace(BREAK, ""))


def _label(text: str, fmt: Qt.TextFormat, name: str = "") -> QLabel:
    label = _WrappedLabel()
    label.setTextFormat(fmt)
    label.setWordWrap(True)
    label.setTextInteractionFlags(_SELECTABLE)
    label.setOpenExternalLinks(True)
    if name:
        label.setObjectName(name)
    label.setText(text)
    return label


def focus_stops(widget: QWidget) -> list[QWidget]:
    """The widgets under ``widget`` that Tab stops at."""
    return [w for w in widget.findChildren(QWidget) if w.focusPolicy() & Qt.FocusPolicy.TabFocus]


def tab_after(anchor: QWidget, stops: list[QWidget]) -> None:
    """Tab reaches ``stops``, in that order, right after ``anchor`` (Qt puts a widget made later at the end
    of the window's chain, past every dock)."""
    for a, b in zip([anchor, *stops], stops):
        QWidget.setTabOrder(a, b)


def tab_before(target: QWidget, stops: list[QWidget]) -> None:
    """Tab reaches ``stops``, in that order, just before ``target`` (after the stop that comes before it now;
    Qt leaves the order of a NoFocus widget be)."""
    anchor = target.previousInFocusChain()
    while anchor in stops or not anchor.focusPolicy() & Qt.FocusPolicy.TabFocus:
        if anchor is target:
            return                          # no other stop in the window
        anchor = anchor.previousInFocusChain()
    tab_after(anchor, [*stops, target])


def last_stop(widget: QWidget) -> QWidget | None:
    """The stop under ``widget`` that Tab reaches last, where its stops lie together in the chain."""
    stops = focus_stops(widget)
    if not stops:
        return None
    last = w = stops[0]
    while (w := w.nextInFocusChain()) is not stops[0] and widget.isAncestorOf(w):
        if w in stops:
            last = w
    return last


def _flat_button(text: str, tip: str) -> QPushButton:
    button = QPushButton(text)
    button.setFlat(True)
    button.setToolTip(tip)
    return button


# control characters (a model may write any byte) shown as their visible symbols (U+2400 on), never sent
# to the terminal emulation of a label; tabs and line breaks stay
_CONTROLS = {c: 0x2400 + c for c in range(32) if chr(c) not in "\t\n\r"} | {0x7F: 0x2421}


def shown(text: str) -> str:
    """``text`` as a message shows it: control characters as their symbols (the message keeps them)."""
    return text.translate(_CONTROLS)


# A label wraps at spaces only, so one long word (a URL, a hash, a long code line) would widen its bubble
# and with it the whole transcript. Runs of LONG_RUN printable ASCII characters or more are shown with a
# zero-width break point after every BREAK_EVERY characters: a line breaks there only where it must. Only
# ASCII: no character there joins the next into one (an accent, an emoji sequence, a flag), and the scripts
# written without spaces (Thai, CJK) Qt breaks by itself. Copies leave the break points out.
BREAK = "\u200b"
BREAK_EVERY = 16
LONG_RUN = 32
_PLAIN_RUN = re.compile(r"[!-~]{" + str(LONG_RUN) + ",}")
_HTML_TEXT = re.compile(r">([^<]+)<")
_ASCII = r"(?:&[#\w]+;|[!-%'-~])"             # an entity, or a printable ASCII character but "&"
_HTML_RUN = re.compile(_ASCII + r"(?:" + _ASCII + r"|&){" + str(LONG_RUN - 1) + ",}")
_PIECE = re.compile(r"&[#\w]+;|.", re.DOTALL)


def _break_run(run: str) -> str:
    pieces = _PIECE.findall(run)                # an HTML entity is one piece: never split inside one
    return BREAK.join("".join(pieces[i:i + BREAK_EVERY]) for i in range(0, len(pieces), BREAK_EVERY))


def breakable(text: str) -> str:
    """Plain ``text`` with break points in its long runs of non-space characters."""
    return _PLAIN_RUN.sub(lambda m: _break_run(m.group()), text)


def breakable_html(html: str) -> str:
    """``html`` with break points in the long runs of its text, never inside a tag or an attribute (a
    link's address stays whole)."""
    return _HTML_TEXT.sub(lambda m: ">" + _HTML_RUN.sub(lambda r: _break_run(r.group()), m.group(1)) + "<", html)


def block_widget(block: Block) -> QLabel:
    """One rendered block: Markdown text, or a monospaced code box."""
    if block.kind == "code":
        label = _label(breakable(shown(block.text)), Qt.TextFormat.PlainText, "codeBlock")
        label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        if block.lang:
            label.setToolTip(block.lang)
        return label
    return _label(breakable_html(markdown_html(shown(block.text))), Qt.TextFormat.RichText)


class StreamingTail(QTextEdit):
    """The unfinished end of a streaming reply, as plain text that only ever grows at its end.

    Text is appended with a cursor, so Qt lays out only the last line again; the widget's height follows
    the document, so the transcript re-lays itself out only when a line is added, not per text delta.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("streamTail")
        self.setStyleSheet("QTextEdit#streamTail { background: transparent; border: none; padding: 0; }")
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(0)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)     # a long word wraps too
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._fit_height(self.document().size())

    def text(self) -> str:
        return self.toPlainText()

    def set_text(self, text: str) -> None:
        """Replace everything (once per finished block)."""
        self.setPlainText(shown(text))
        self.setVisible(bool(text))

    def append_text(self, text: str) -> None:
        """Add ``text`` at the end without touching what is already laid out."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(shown(text))
        self.setVisible(not self.document().isEmpty())

    def _fit_height(self, size: QSizeF) -> None:
        height = math.ceil(size.height()) + 2 * self.frameWidth()
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)


class ReasoningBlock(QWidget):
    """A reasoning model's thinking above its answer: a "Reasoning" toggle (collapsed by default) over the
    text, dimmed; hidden while there is none. Streamed text is added at the end of what is laid out (as the
    answer's tail is): laying the whole of a long thought out again for every batch froze the window. At most
    SHOWN_CHARS characters are shown; the toggle counts every word, and an export of the chat keeps them all."""

    def __init__(self) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        self.toggle = QToolButton()
        self.toggle.setObjectName("reasoningToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setAutoRaise(True)
        self.toggle.toggled.connect(self._expand)
        lay.addWidget(self.toggle)
        self.label = StreamingTail()
        self.label.setObjectName("reasoningText")
        self.label.setStyleSheet("QTextEdit#reasoningText { color: palette(placeholder-text); background: "
                                 "transparent; border: none; padding: 0; }")
        lay.addWidget(self.label)
        self.text = ""
        self._words = 0
        self.set_text("")

    def _expand(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.label.setVisible(on and bool(self.text))

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_text(self, text: str) -> None:
        self.text, self._words = text, len(text.split())
        self.label.set_text(text[:SHOWN_CHARS])
        self._shown()

    def append(self, text: str) -> None:
        tail = self.text[-64:]            # a word cut between batches is counted once: as its start, then whole
        self._words += len((tail + text).split()) - len(tail.split())
        room = SHOWN_CHARS - len(self.text)
        self.text += text
        if room > 0:
            self.label.append_text(text[:room])
        self._shown()

    def _shown(self) -> None:
        more = len(self.text) - SHOWN_CHARS
        words = f"{self._words:,} word{'' if self._words == 1 else 's'}"
        self.toggle.setText(f"Reasoning ({words}" + (f"; the last {more:,} characters are not shown "
                                                                     "here: an export keeps them" if more > 0 else "") + ")")
        self.setVisible(bool(self.text))
        self._expand(self.toggle.isChecked())


# A message shows at most this many characters: laying out half a megabyte of text (a pasted log) took
# the window 1.5 s each time it was shown. The rest is named under it, and Copy and export keep it all.
SHOWN_CHARS = 50_000


_ERROR_LINE = re.compile(r"(^|· )error: ")


class MessageBubble(QFrame):
    """One message. Assistant bubbles stream (``append`` then ``finish``) and page through the replies the
    model gave to the turn: ``page_requested(-1 | +1)``, ``delete_version_requested``.

    The parts few messages use (the reasoning block, the streaming tail, the pager) are made when first
    needed: a long chat opens a bubble per message, and each widget made costs the window time."""

    ROLE_NAMES = {"user": "You", "assistant": "Assistant", "notice": "Strata"}
    page_requested = Signal(int)
    delete_version_requested = Signal()

    def __init__(self, role: str, text: str = "", streaming: bool = False) -> None:
        super().__init__()
        self.role = role
        self.text = ""
        self._pending = ""          # text not yet part of a finished block (what the tail shows)
        self._shown = 0             # characters rendered in blocks (at most SHOWN_CHARS)
        self.setObjectName({"user": "userBubble", "notice": "noticeBubble"}.get(role, "assistantBubble"))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 8)
        lay.setSpacing(4)
        head = QHBoxLayout()
        name = QLabel(self.ROLE_NAMES.get(role, role))
        name.setObjectName("role")
        head.addWidget(name)
        head.addStretch(1)
        self._head = head
        self._pager: tuple[QPushButton, QLabel, QPushButton, QPushButton] | None = None
        self.copy_button = QPushButton("Copy")
        self.copy_button.setFlat(True)
        self.copy_button.setToolTip("Copy this message as Markdown")
        self.copy_button.clicked.connect(self.copy)
        head.addWidget(self.copy_button)
        lay.addLayout(head)
        self._reasoning: ReasoningBlock | None = None
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        lay.addLayout(self.body)
        self._blocks: list[QWidget] = []
        self._tail: StreamingTail | None = None
        self.cut_note = QLabel("")
        self.cut_note.setObjectName("replyStats")
        self.cut_note.setWordWrap(True)         # never wider than the bubble
        self.cut_note.hide()
        lay.addWidget(self.cut_note)
        self.stats = QLabel("")
        self.stats.setObjectName("replyStats")
        self.stats.setWordWrap(True)
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats.hide()
        lay.addWidget(self.stats)
        self.streaming = streaming
        if text:
            self.append(text)
        if not streaming:
            self.finish()

    def sizeHint(self) -> QSize:
        # its height at the width it has (the transcript gives it that width before it goes on screen): Qt's
        # own would lay each label out again at the label's hint width
        width = self.width()
        return QSize(width, self.heightForWidth(width))

    @property
    def reasoning(self) -> ReasoningBlock:
        """The reasoning block above the text (made at first use, between the header and the text)."""
        if self._reasoning is None:
            self._reasoning = ReasoningBlock()
            self.layout().insertWidget(1, self._reasoning)
            tab_after(self.copy_button, focus_stops(self._reasoning))   # Tab: the header's buttons, then it
        return self._reasoning

    def set_reasoning(self, text: str) -> None:
        """Show ``text`` as the message's reasoning ("" hides it; no block is made for none)."""
        if text or self._reasoning is not None:
            self.reasoning.set_text(text)

    @property
    def tail(self) -> StreamingTail:
        """The unfinished end of a streaming reply (made at first use, under the rendered blocks)."""
        if self._tail is None:
            self._tail = StreamingTail()
            self._tail.hide()
            self.layout().insertWidget(self.layout().indexOf(self.cut_note), self._tail)
        return self._tail

    def _clear_tail(self) -> None:
        if self._tail is not None:
            self._tail.set_text("")

    def _pager_widgets(self) -> tuple[QPushButton, QLabel, QPushButton, QPushButton]:
        """"‹ 2/3 ›" and Delete (this version), made the first time a turn has more than one reply."""
        if self._pager is None:
            prev = _flat_button("‹", "The previous version of this reply")
            prev.clicked.connect(lambda: self.page_requested.emit(-1))
            label = QLabel("")
            label.setObjectName("role")
            nxt = _flat_button("›", "The next version of this reply")
            nxt.clicked.connect(lambda: self.page_requested.emit(1))
            delete = _flat_button("Delete", "Delete this version of the reply; the other versions stay")
            delete.clicked.connect(self.delete_version_requested)
            self._pager = (prev, label, nxt, delete)
            for w in self._pager:
                self._head.insertWidget(self._head.indexOf(self.copy_button), w)
                w.hide()
            tab_before(self.copy_button, [prev, nxt, delete])           # Tab: ‹ › Delete, then Copy, as shown
        return self._pager

    @property
    def prev_button(self) -> QPushButton:
        return self._pager_widgets()[0]

    @property
    def pager_label(self) -> QLabel:
        return self._pager_widgets()[1]

    @property
    def next_button(self) -> QPushButton:
        return self._pager_widgets()[2]

    @property
    def delete_version_button(self) -> QPushButton:
        return self._pager_widgets()[3]

    def set_pager(self, index: int, count: int, enabled: bool = True) -> None:
        """Show "‹ index+1/count ›" (hidden for a single reply); ``enabled`` False while a reply streams."""
        many = count > 1
        if not many and self._pager is None:
            return                              # nothing to page, nothing to hide
        self.pager_label.setText(f"{index + 1}/{count}" if many else "")
        for w in (self.prev_button, self.pager_label, self.next_button, self.delete_version_button):
            w.setVisible(many)
        self.prev_button.setEnabled(enabled and index > 0)
        self.next_button.setEnabled(enabled and index < count - 1)
        self.delete_version_button.setEnabled(enabled)

    def show_text(self, text: str, stats_line: str = "", streaming: bool = False, reasoning: str = "") -> None:
        """Show another text in this bubble (another version of the reply, or a new one streaming in)."""
        self.set_reasoning(reasoning)
        # by widget, never through the layout's items: a QLayoutItem handed to Python outlives its C++ object
        # in the binding's table, and a later object at the same address would come back as that item
        for widget in self._blocks:
            self.body.removeWidget(widget)
            widget.hide()               # gone at once, not only when Qt gets round to deleting it
            widget.deleteLater()
        self._blocks = []
        self.text, self._pending, self._shown = "", "", 0
        self.cut_note.hide()
        self._clear_tail()
        self.streaming = streaming
        if text:
            self.append(text)
        if streaming:
            self.set_stats(stats_line)
        else:
            self.finish(stats_line)

    def append(self, text: str) -> None:
        """More streamed text: finished blocks are rendered once, the rest shows as plain text."""
        self.text += text
        if self._shown >= SHOWN_CHARS:          # past what a message shows: kept, named at its end
            return
        grown = self._pending + text
        blocks, self._pending = split_finished(grown)
        for block in blocks:
            self._add_block(block)
        if self._shown >= SHOWN_CHARS:
            self._pending = ""
            self._clear_tail()
        elif not self.streaming:
            pass                                 # a whole message: finish() renders the rest, no tail needed
        elif not blocks and self._pending == grown:
            self.tail.append_text(text)          # the common case: the tail only grows at its end
        else:
            self.tail.set_text(self._pending)

    def _add_block(self, block: Block) -> None:
        room = SHOWN_CHARS - self._shown
        if room <= 0:
            return
        if len(block.text) > room:
            block = Block(block.kind, block.text[:room], block.lang)
        self._shown += len(block.text)
        widget = block_widget(block)
        self.body.addWidget(widget)
        self._blocks.append(widget)

    def finish(self, stats_line: str = "") -> None:
        """The message is complete: render what is left and show the reply's stats."""
        self.streaming = False
        for block in split_all(self._pending):
            self._add_block(block)
        self._pending = ""
        self._clear_tail()
        hidden = len(self.text) - self._shown
        if self._shown >= SHOWN_CHARS and hidden > 0:
            self.cut_note.setText(f"… and {hidden:,} more characters, not shown here: Copy copies the whole "
                                  "message, and an export keeps it")
        self.cut_note.setVisible(self._shown >= SHOWN_CHARS and hidden > 0)
        self.set_stats(stats_line)

    def set_stats(self, line: str) -> None:
        # a word joiner inside "tok/s": a narrow pane wraps it whole, never as "tok/" and "s" (only
        # there: a path in an error line stays as it is, for copying)
        self.stats.setText(line.replace("tok/s", "tok/\u2060s"))
        self.stats.setVisible(bool(line))
        name = "replyError" if _ERROR_LINE.search(line) else "replyStats"     # a failed reply says so in red
        if self.stats.objectName() != name:
            self.stats.setObjectName(name)
            self.stats.style().unpolish(self.stats)
            self.stats.style().polish(self.stats)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
