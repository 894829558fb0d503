"""The chat pane: model line, transcript, context meter, prompt box with Send/Stop/Regenerate/Edit, and the
system prompt and sampling settings. It only emits intentions; the chat controller acts on them."""
from __future__ import annotations

import re

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent, QPainter, QPalette, QResizeEvent
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QFrame, QGridLayout, QGroupBox, QHBoxLayout,
                               QLabel, QPlainTextEdit, QPushButton, QScrollArea, QSizePolicy, QToolButton, QVBoxLayout,
                               QWidget)

from app.transcript import ChatView
from app.messages import CONTEXT_OVERFLOW_POLICIES, REASONING_EFFORTS, GenerationSettings
from app.panels.base import CaptionLabel
from app.range_spin import RangeDoubleSpin, RangeNote, RangeSpin
from app.window_layout import WrappingWidget

OVERFLOW_NAMES = {"drop-oldest": "drop the oldest turns", "stop": "stop and say so"}
_HINTS = {True: "Message the model — Enter to send, Shift+Enter for a new line",
          False: "Message the model — Ctrl+Enter to send, Enter for a new line"}


_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")
VIEW_MIN_LINES = 8      # the transcript keeps room for this many lines whatever else the pane shows


class ShortScroll(QScrollArea):
    """Holds a part of the pane that may open tall (the demo note opened, the sampling settings unfolded): as
    tall as it is where the pane has room, and down to ``lines`` lines with a scroll bar where it has not, so
    opening it never makes the window taller (on a small screen: past the screen's bottom, for good). Shown
    and hidden with the part it holds."""

    def __init__(self, part: QWidget, lines: int, keys_scroll: bool = False) -> None:
        super().__init__()
        self._lines = lines
        self._asked = -1                    # the height its last size hint asked for
        if not keys_scroll:                 # Tab goes to what it holds (scrolled into sight), not to the frame;
            self.setFocusPolicy(Qt.FocusPolicy.NoFocus)   # a part with nothing to focus keeps it, for the arrows
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidgetResizable(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setWidget(part)
        part.installEventFilter(self)
        self.setVisible(not part.isHidden())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.ShowToParent, QEvent.Type.HideToParent):
            self.setVisible(kind == QEvent.Type.ShowToParent)
        elif kind == QEvent.Type.LayoutRequest:
            self.updateGeometry()           # the part opened or folded: another height to ask for
        return False

    def resizeEvent(self, event) -> None:
        """Narrower, the part's lines wrap to more rows (wider, to fewer): the height it asks for follows."""
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width() and self._part_height() != self._asked:
            self.updateGeometry()

    def _part_height(self) -> int:
        part = self.widget()
        width = self.viewport().width() if self.testAttribute(Qt.WidgetAttribute.WA_Resized) else 0
        if width > 0 and part.hasHeightForWidth():
            return max(part.heightForWidth(width), part.minimumSizeHint().height())
        return part.sizeHint().height()

    def sizeHint(self) -> QSize:
        self._asked = self._part_height()
        return QSize(self.widget().sizeHint().width(), self._asked)

    def minimumSizeHint(self) -> QSize:
        cap = self._lines * self.fontMetrics().lineSpacing()
        return QSize(self.widget().minimumSizeHint().width(), min(self._part_height(), cap))


class FoldedNote(QWidget):
    """A note shown as one line cut with "…" (whole in its tooltip) and a "more" button that opens it whole,
    "less" folding it back: a long notice never takes the chat's room unasked. Hidden while it has no text."""

    def __init__(self) -> None:
        super().__init__()
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.label = CaptionLabel()
        self.label.setObjectName("demoNotice")
        self.whole = QLabel()              # the note opened: wrapped over as many lines as it takes
        self.whole.setObjectName("demoNotice")
        self.whole.setWordWrap(True)
        self.whole.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        for label in (self.label, self.whole):
            label.setStyleSheet("color: #f0a030")      # amber, as the banners' warnings
        self.toggle = QToolButton()
        self.toggle.setAutoRaise(True)
        self.toggle.setCheckable(True)
        self.toggle.toggled.connect(self.set_open)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.whole, 1)
        lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignTop)
        self.set_text("")

    def set_text(self, text: str) -> None:
        self.label.setText(text)
        self.whole.setText(text)
        self.toggle.setChecked(False)
        self.set_open(False)
        self.setVisible(bool(text))

    def text(self) -> str:
        return self.whole.text()

    def set_open(self, shown: bool) -> None:
        self.whole.setVisible(shown)
        self.label.setVisible(not shown)
        self.toggle.setText("less" if shown else "more")
        self.toggle.setToolTip("Fold the note to one line" if shown else "Show the whole note")


class SettingsBox(QGroupBox):
    """System prompt and sampling settings (collapsible); ``changed`` when a sampling setting changes."""

    changed = Signal()

    def __init__(self) -> None:
        super().__init__("System prompt and sampling")
        self.setCheckable(True)
        self.setChecked(False)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 0, 6, 4)
        self.contents = QWidget()
        outer.addWidget(self.contents)
        # collapsed, the box shows what is in force in one line, so it does not read as an empty field
        self.summary = QLabel()
        self.summary.setObjectName("settingsSummary")
        self.summary.setWordWrap(True)
        outer.addWidget(self.summary)
        self.form = QFormLayout(self.contents)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional instructions for the assistant")
        self.system_prompt.setFixedHeight(54)
        self._build_sampling()
        self.form.addRow("System", self.system_prompt)
        self.form.addRow(self._grid())
        self.range_note = RangeNote()          # a number typed out of range
        self.form.addRow(self.range_note)
        for box in (self.temperature, self.top_p, self.top_k, self.max_tokens):
            box.setKeyboardTracking(False)      # a number counts once entered: "100000" never passes for 10000
        self.range_note.watch(self.temperature, self.top_p, self.top_k, self.max_tokens)
        self.toggled.connect(self.contents.setVisible)
        self.toggled.connect(lambda shown: self.summary.setVisible(not shown))
        self.set_settings(GenerationSettings())
        self.contents.setVisible(False)
        self.set_reasoning_shown(False)
        for signal in (self.temperature.valueChanged, self.top_p.valueChanged, self.top_k.valueChanged,
                       self.max_tokens.valueChanged, self.overflow.currentIndexChanged,
                       self.effort.currentIndexChanged):
            signal.connect(self.changed)
        self.changed.connect(self._summarise)
        self.system_prompt.textChanged.connect(self._summarise)
        self._summarise()

    def commit(self) -> None:
        """Take a number typed into a box but not entered yet (Enter, or leaving the box, would)."""
        for box in (self.temperature, self.top_p, self.top_k, self.max_tokens):
            box.interpretText()

    def _summarise(self) -> None:
        s = self.settings()
        parts = ["greedy" if s.temperature == 0 else f"temperature {s.temperature:g}"]
        if s.top_p < 1:
            parts.append(f"top-p {s.top_p:g}")
        if s.top_k:
            parts.append(f"top-k {s.top_k}")
        parts.append(f"at most {s.max_tokens} tokens")
        if getattr(self, "_reasoning", False):
            parts.append(f"reasoning {s.reasoning_effort}")
        if self.system_prompt.toPlainText().strip() and self.form.isRowVisible(self.system_prompt):
            parts.append("system prompt set")
        self.summary.setText(" · ".join(parts) + " (tick to change)")

    def _build_sampling(self) -> None:
        self.temperature = RangeDoubleSpin()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setToolTip("0 = greedy (always the most likely token)")
        self.top_p = RangeDoubleSpin()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.01)
        self.top_k = RangeSpin()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = RangeSpin()
        self.max_tokens.setRange(1, 32768)
        self.overflow = QComboBox()
        for policy in CONTEXT_OVERFLOW_POLICIES:
            self.overflow.addItem(OVERFLOW_NAMES.get(policy, policy), policy)
        self.overflow.setToolTip("Drop the oldest turns (the system prompt stays) and say so in the chat, "
                                 "or stop with a message saying the chat is too long")
        self.effort = QComboBox()
        for effort in REASONING_EFFORTS:
            self.effort.addItem(effort, effort)
        self.effort.setToolTip("How hard a reasoning model thinks before it answers (written into its system "
                               "message); higher takes more tokens")
        self.effort_label = QLabel("Reasoning")

    def _grid(self) -> QGridLayout:
        """The sampling settings: two a row where the box has room, one a row in a narrow chat pane."""
        self.grid = QGridLayout()
        self._pairs = [(QLabel(text), w) for text, w in (
            ("Temperature", self.temperature), ("Top-p", self.top_p), ("Top-k", self.top_k),
            ("Max tokens", self.max_tokens), ("Chat too long", self.overflow))]
        self._pairs.append((self.effort_label, self.effort))
        self._per_row = 0
        self._arrange(2)
        return self.grid

    def _arrange(self, per_row: int) -> None:
        """Place the pairs ``per_row`` to a row; the overflow policy and reasoning effort have rows of their own."""
        if per_row == self._per_row:
            return
        self._per_row = per_row
        while self.grid.takeAt(0) is not None:      # the widgets stay the box's; only their cells change
            pass
        for column in range(5):
            self.grid.setColumnStretch(column, 0)
        for i, (label, w) in enumerate(self._pairs[:4]):
            self.grid.addWidget(label, i // per_row, (i % per_row) * 2)
            self.grid.addWidget(w, i // per_row, (i % per_row) * 2 + 1)
        row = 4 // per_row
        for label, w in self._pairs[4:]:
            self.grid.addWidget(label, row, 0)
            self.grid.addWidget(w, row, 1, 1, 1 if w is self.effort else 2 * per_row - 1)
            row += 1
        self.grid.setColumnStretch(2 * per_row, 1)

    def _two_per_row_width(self) -> int:
        """The least width that shows two pairs a row with every label whole."""
        def widest(widgets) -> int:
            return max(w.minimumSizeHint().width() for w in widgets)
        labels, fields = [label for label, _ in self._pairs], [w for _, w in self._pairs]
        space = self.grid.horizontalSpacing()
        first = widest(labels[0:1] + labels[2:3] + labels[4:])
        right = widest(fields[0:1] + fields[2:3] + fields[5:]) + widest(labels[1:2] + labels[3:4]) \
            + widest(fields[1:2] + fields[3:4]) + 2 * space
        return first + space + max(right, self.overflow.minimumSizeHint().width())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        m = self.layout().contentsMargins()     # (the layout's own geometry follows only after this event)
        room = self.contentsRect().width() - m.left() - m.right()
        self._arrange(2 if room >= self._two_per_row_width() else 1)

    def minimumSizeHint(self) -> QSize:
        """As narrow as one pair a row (it reflows to that when given less than two need): the scroll area
        it sits in never lays it out narrower than this."""
        hint = super().minimumSizeHint()
        if self._per_row == 2 and self.isChecked():
            labels, fields = [label for label, _ in self._pairs], [w for _, w in self._pairs]
            m, frame = self.layout().contentsMargins(), self.width() - self.contentsRect().width()
            one = (max(w.minimumSizeHint().width() for w in labels) + self.grid.horizontalSpacing()
                   + max(w.minimumSizeHint().width() for w in fields) + m.left() + m.right() + max(frame, 0))
            hint.setWidth(min(hint.width(), one))
        return hint

    def settings(self) -> GenerationSettings:
        return GenerationSettings(temperature=self.temperature.value(), top_p=self.top_p.value(),
                                  top_k=self.top_k.value(), max_tokens=self.max_tokens.value(),
                                  context_overflow=self.overflow.currentData(),
                                  reasoning_effort=self.effort.currentData())

    def set_settings(self, s: GenerationSettings) -> None:
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.max_tokens.setValue(s.max_tokens)
        index = self.overflow.findData(s.context_overflow)
        self.overflow.setCurrentIndex(max(index, 0))
        self.effort.setCurrentIndex(max(self.effort.findData(s.reasoning_effort), 0))

    def set_reasoning_shown(self, shown: bool) -> None:
        """The reasoning effort applies to reasoning models only; for others it is hidden (and kept)."""
        self.effort.setVisible(shown)
        self.effort_label.setVisible(shown)
        self._reasoning = shown
        self._summarise()

    def set_system_prompt_shown(self, shown: bool) -> None:
        """Completion mode has no system prompt: its field is hidden (its text is kept for chat models)."""
        self.form.setRowVisible(self.system_prompt, shown)
        self.setTitle("System prompt and sampling" if shown else "Sampling")
        self._summarise()


class PromptBox(QPlainTextEdit):
    """The message box: Enter sends and Shift+Enter starts a new line (or, with ``enter_sends`` off,
    Enter starts a new line); Ctrl+Enter always sends. HEIGHT tall, and down to MIN_HEIGHT (two lines) in
    a window too short for that, never over the buttons under it. Tab moves on to the buttons, as in a
    form (a keyboard alone must reach Send); pasted text keeps its tabs."""

    submitted = Signal()
    HEIGHT = 84
    MIN_HEIGHT = 52

    def __init__(self) -> None:
        super().__init__()
        self.setTabChangesFocus(True)
        self.enter_sends = True
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        self.setMinimumHeight(self.MIN_HEIGHT)

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.HEIGHT)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() not in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            super().keyPressEvent(event)
            return
        mods = event.modifiers()
        if mods & Qt.KeyboardModifier.ControlModifier or (self.enter_sends and
                                                           not mods & Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
        else:
            self.insertPlainText("\n")      # a plain line break, whatever the modifier
        event.accept()


class _ShareBar(QWidget):
    """A fixed-size bar filled to ``value() / 1000``, painted when the window next paints. (A QProgressBar
    repaints at once on each new value, which in a window holding a long chat took a tenth of a second.)"""

    def __init__(self) -> None:
        super().__init__()
        self.setFixedSize(80, 8)
        self._value = 0

    def value(self) -> int:
        return self._value

    def setValue(self, value: int) -> None:   # noqa: N802 - QProgressBar's name, which it stands in for
        if value != self._value:
            self._value = value
            self.update()

    def paintEvent(self, _event) -> None:   # noqa: N802 - Qt's name
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Mid))
        filled = round(self.width() * self._value / 1000)
        p.fillRect(0, 0, filled, self.height(), pal.color(QPalette.ColorRole.Highlight))


class _ShorteningLabel(CaptionLabel):
    """A CaptionLabel that, where its whole text does not fit, shows the first of its ``shorter`` forms that
    does (the last one cut with "…" if none fits); its tooltip then holds the whole text over the note."""

    def __init__(self, text: str = "") -> None:
        self.shorter: tuple[str, ...] = ()
        super().__init__(text)

    def set_text(self, text: str, shorter: tuple[str, ...]) -> None:
        self.shorter = shorter
        self.setText(text)

    def shown_text(self) -> str:
        metrics, width = self.fontMetrics(), self.contentsRect().width()
        forms = (self.text(), *self.shorter)
        fitting = next((form for form in forms if metrics.horizontalAdvance(form) <= width), None)
        return fitting if fitting is not None else metrics.elidedText(forms[-1], Qt.TextElideMode.ElideRight, width)


class ContextMeter(QWidget):
    """"Context 312 / 512 tokens" and a small bar; "—" where nothing is known yet. A narrow pane shows
    "312 / 512 tokens" or "312/512" instead, the whole line in the tooltip."""

    def __init__(self) -> None:
        super().__init__()
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.label = _ShorteningLabel("Context —")
        self.label.setObjectName("replyStats")
        # whole where the pane has room; in a narrow one shortened (whole in its tooltip), never over the bar
        self.label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.label.ensurePolished()
        self.label.setMinimumWidth(self.label.fontMetrics().horizontalAdvance("Context —"))
        self.bar = _ShareBar()
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        self.set_usage(None, 0)

    def set_usage(self, used: int | None, total: int) -> None:
        """``used`` tokens of a ``total``-token context (None: not known for this chat yet; 0: no model).
        Only what changed is set: a new label text lays the window out again."""
        shown_used = "—" if used is None else str(used)
        text = f"Context {shown_used} / {total} tokens" if total > 0 else "Context —"
        if text != self.label.text():
            shorter = (f"{shown_used} / {total} tokens", f"{shown_used}/{total}") if total > 0 else ()
            self.label.set_text(text, shorter)
        self.bar.setValue(0 if used is None or total <= 0 else min(1000, round(1000 * used / total)))
        tip = ("How much of the model's context this chat's last request took, with its reply"
               if total > 0 else "Load a model to see how much of its context this chat takes")
        if tip != self.toolTip():
            self.setToolTip(tip)
            self.label.set_note(tip)      # the label's own tooltip (its whole text while cut) keeps this too


class ChatPane(WrappingWidget):
    """Chat widgets; ``send_requested(text)``, ``stop_requested``, ``regenerate_requested``, ``edit_requested``,
    ``enter_sends_changed(bool)``. Its least height counts the rows its wrapped lines take at its width."""

    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal()
    enter_sends_changed = Signal(bool)

    def __init__(self) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        self.model_line = QLabel("No model loaded")
        self.model_line.setObjectName("modelBadge")
        self.model_line.setWordWrap(True)
        self.model_line.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.model_line)
        self.notice = FoldedNote()
        lay.addWidget(ShortScroll(self.notice, 2, keys_scroll=True))
        self.view = ChatView()
        frame = 2 * self.view.frameWidth() + 8
        self.view.setMinimumHeight(VIEW_MIN_LINES * self.view.fontMetrics().lineSpacing() + frame)
        lay.addWidget(self.view, 1)
        self.settings_box = SettingsBox()
        lay.addWidget(ShortScroll(self.settings_box, 4))
        self.mode_label = QLabel("")            # a row of its own: a narrow window wraps it across the pane
        self.mode_label.setObjectName("replyStats")
        self.mode_label.setWordWrap(True)
        lay.addWidget(self.mode_label)
        lay.addLayout(self._status_row())
        self.input = PromptBox()
        self.input.submitted.connect(self._send)
        lay.addWidget(self.input)
        lay.addLayout(self._buttons())
        self.set_enter_sends(True)
        self.set_busy(False)

    def _status_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.context_meter = ContextMeter()
        row.addWidget(self.context_meter)
        row.addStretch(1)
        self.enter_sends_box = QCheckBox("Enter sends")
        self.enter_sends_box.setToolTip("On: Enter sends, Shift+Enter starts a new line. "
                                        "Off: Enter starts a new line, Ctrl+Enter sends.")
        self.enter_sends_box.toggled.connect(self._enter_sends_toggled)
        row.addWidget(self.enter_sends_box)
        return row

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addStretch(1)
        self.edit_button = QToolButton()
        self.edit_button.setText("Edit last")
        self.edit_button.setToolTip("Put your last message back in the box and remove it and its reply")
        self.edit_button.clicked.connect(self.edit_requested)
        self.regen_button = QToolButton()
        self.regen_button.setText("Regenerate")
        self.regen_button.setToolTip("Ask again for the last reply; the earlier replies stay (‹ ›)")
        self.regen_button.clicked.connect(self.regenerate_requested)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("danger")
        self.stop_button.clicked.connect(self.stop_requested)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.clicked.connect(self._send)
        for w in (self.edit_button, self.regen_button, self.stop_button, self.send_button):
            row.addWidget(w)
        return row

    def _send(self) -> None:
        # blank lines around the message go, the first line's indentation stays (pasted code keeps its shape)
        text = _LEADING_BLANK_LINES.sub("", self.input.toPlainText()).rstrip()
        if text.strip() and self.send_button.isEnabled():
            self.input.clear()
            self.send_requested.emit(text)

    def _enter_sends_toggled(self, on: bool) -> None:
        self.input.enter_sends = on
        self.input.setPlaceholderText(_HINTS[on])
        self.enter_sends_changed.emit(on)

    def set_enter_sends(self, on: bool) -> None:
        """Set the Enter-sends preference without emitting ``enter_sends_changed``."""
        self.enter_sends_box.blockSignals(True)
        self.enter_sends_box.setChecked(on)
        self.enter_sends_box.blockSignals(False)
        self.input.enter_sends = on
        self.input.setPlaceholderText(_HINTS[on])

    def set_context(self, used: int | None, total: int) -> None:
        self.context_meter.set_usage(used, total)

    def set_busy(self, busy: bool, can_send: bool = True, has_turn: bool = True) -> None:
        """A reply is streaming: only Stop works; otherwise Send does, and Regenerate and Edit last where
        the chat holds a message of the user's (``has_turn``)."""
        self.stop_button.setEnabled(busy)
        self.send_button.setEnabled(not busy and can_send)
        self.regen_button.setEnabled(not busy and can_send and has_turn)
        self.edit_button.setEnabled(not busy and has_turn)
