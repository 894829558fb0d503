"""The chat pane: model line, transcript, prompt box with Send/Stop/Regenerate/Edit, and the
system prompt and sampling settings. It only emits intentions; the chat controller acts on them."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit,
                               QPushButton, QSpinBox, QToolButton, QVBoxLayout, QWidget)

from app.chat_view import ChatView
from app.messages import GenerationSettings


class SettingsBox(QGroupBox):
    """System prompt and sampling settings (collapsible)."""

    def __init__(self) -> None:
        super().__init__("System prompt and sampling")
        self.setCheckable(True)
        self.setChecked(False)
        form = QFormLayout(self)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional instructions for the assistant")
        self.system_prompt.setFixedHeight(54)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setToolTip("0 = greedy (always the most likely token)")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.01)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        row = QHBoxLayout()
        for label, w in (("Temperature", self.temperature), ("Top-p", self.top_p), ("Top-k", self.top_k),
                         ("Max tokens", self.max_tokens)):
            row.addWidget(QLabel(label))
            row.addWidget(w)
        form.addRow("System", self.system_prompt)
        form.addRow(row)
        self.toggled.connect(self._show_contents)
        self.set_settings(GenerationSettings())
        self._show_contents(False)

    def _show_contents(self, on: bool) -> None:
        for child in self.findChildren(QWidget):
            child.setVisible(on)

    def settings(self) -> GenerationSettings:
        return GenerationSettings(temperature=self.temperature.value(), top_p=self.top_p.value(),
                                  top_k=self.top_k.value(), max_tokens=self.max_tokens.value())

    def set_settings(self, s: GenerationSettings) -> None:
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.max_tokens.setValue(s.max_tokens)


class ChatPane(QWidget):
    """Chat widgets; ``send_requested(text)``, ``stop_requested``, ``regenerate_requested``, ``edit_requested``."""

    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        self.model_line = QLabel("No model loaded")
        self.model_line.setObjectName("modelBadge")
        self.model_line.setWordWrap(True)
        self.model_line.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.model_line)
        self.view = ChatView()
        lay.addWidget(self.view, 1)
        self.settings_box = SettingsBox()
        lay.addWidget(self.settings_box)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message the model — Ctrl+Enter to send")
        self.input.setFixedHeight(84)
        lay.addWidget(self.input)
        lay.addLayout(self._buttons())
        QShortcut(QKeySequence("Ctrl+Return"), self.input, activated=self._send)
        self.set_busy(False)

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.mode_label = QLabel("")
        self.mode_label.setObjectName("replyStats")
        row.addWidget(self.mode_label, 1)
        self.edit_button = QToolButton()
        self.edit_button.setText("Edit last")
        self.edit_button.setToolTip("Put your last message back in the box and remove it and its reply")
        self.edit_button.clicked.connect(self.edit_requested)
        self.regen_button = QToolButton()
        self.regen_button.setText("Regenerate")
        self.regen_button.setToolTip("Ask again for the last reply")
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
        text = self.input.toPlainText().strip()
        if text and self.send_button.isEnabled():
            self.input.clear()
            self.send_requested.emit(text)

    def set_busy(self, busy: bool, can_send: bool = True) -> None:
        """A reply is streaming: only Stop works; otherwise Send/Regenerate/Edit do."""
        self.stop_button.setEnabled(busy)
        self.send_button.setEnabled(not busy and can_send)
        self.regen_button.setEnabled(not busy and can_send)
        self.edit_button.setEnabled(not busy)
