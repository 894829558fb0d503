"""Load test: N concurrent synthetic requests; aggregate tok/s against per-stream tok/s.

The requests go to the engine directly (through the bridge) or, while the local server is on, through
HTTP to it (:mod:`app.http_load`): the same table and summary, with the HTTP path's own overhead in it.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QFormLayout, QFrame, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QScrollArea, QTableWidget, QTableWidgetItem, QVBoxLayout)

from app.http_load import HttpLoad, HttpLoadRun, PromptIds
from app.local_server import SWITCH_MENU
from app.messages import GenerationSettings, ReplyRequest, ReplyStats
from app.range_spin import RangeNote, RangeSpin

COLUMNS = ("Stream", "Status", "Tokens", "TTFT (ms)", "Decode tok/s")
ENGINE, HTTP = "Engine directly", "Local HTTP server"
HTTP_OFF_TIP = f"Turn on {SWITCH_MENU} to send the load test through HTTP."
TEMPERATURE = 0.8
CLOSE_WAIT_S = 10.0          # what a closing window gives the HTTP streams to end
SUMMARY_LINES = 5            # the summary's room, in lines, before a longer one scrolls


@dataclass(frozen=True)
class LoadTestSummary:
    """A finished test. The speeds and the wall time are those of the streams that did not fail (0 where
    every stream failed): a stream cut short by an error would make batching look better or worse than it is."""

    streams: int
    total_tokens: int            # every stream's, the failed ones' too
    wall_s: float
    aggregate_tok_s: float
    per_stream_tok_s: float      # mean decode speed of one stream
    failed: int = 0              # streams that ended in an error
    first_error: str = ""        # the first of their errors
    stopped: int = 0             # streams stopped by the user before their output length
    finished_tokens: int = -1    # the tokens of the streams that did not fail (-1: all of them)

    def text(self) -> str:
        """One line: the speeds against each other, what was stopped, and what failed with the first error."""
        tokens = self.total_tokens if self.finished_tokens < 0 else self.finished_tokens
        ended = (f"{self.streams} streams" if not self.failed else
                 f"{self.streams} streams, of which the {self.streams - self.failed} that finished made")
        head = (f"{ended} {tokens} tokens in {self.wall_s:.1f} s: aggregate "
                f"{self.aggregate_tok_s:.1f} tok/s vs {self.per_stream_tok_s:.1f} tok/s per stream "
                f"({self.aggregate_tok_s / self.per_stream_tok_s:.2f}× from batching)"
                if self.per_stream_tok_s > 0 and self.failed < self.streams
                else f"{self.streams} streams, {self.total_tokens} tokens")
        if self.stopped:
            which = "every stream" if self.stopped == self.streams else f"{self.stopped} of {self.streams} streams"
            head = f"Stopped: {which} ended early. {head}"
        if not self.failed:
            return head
        which = "every stream" if self.failed == self.streams else f"{self.failed} of {self.streams} streams"
        return f"{head} — {which} failed: {self.first_error}"


def summarise(results: list[ReplyStats]) -> LoadTestSummary:
    """Aggregate = the tokens of the streams that did not fail over the wall time they took together;
    per stream = their mean decode speed. No speeds where every stream failed."""
    failed = [r for r in results if r.finish_reason == "error" or r.error]
    ok = [r for r in results if not (r.finish_reason == "error" or r.error)]
    tokens = sum(r.completion_tokens for r in ok)
    wall = max(r.finished for r in ok) - min(r.started for r in ok) if ok else 0.0
    speeds = [r.decode_tok_s for r in ok if r.decode_tok_s]
    stopped = sum(1 for r in results if r.finish_reason == "abort")
    return LoadTestSummary(len(results), sum(r.completion_tokens for r in results), wall,
                           tokens / wall if wall > 0 else 0.0, sum(speeds) / len(speeds) if speeds else 0.0,
                           len(failed), (failed[0].error or "the reply failed") if failed else "", stopped,
                           tokens)


class FittedLabel(QLabel):
    """A label that wraps to its width and asks for the height of all its lines at that width, never fewer:
    the dialog's layout then shrinks the table for them, or the dialog grows, and no line is cut.
    ``then``: called when its text changes (the box it is in asks for room again)."""

    def __init__(self, text: str = "", then: Callable[[], None] | None = None) -> None:
        super().__init__(text)
        self._then = then
        self.setWordWrap(True)
        self.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)

    def lines_height(self, width: int | None = None) -> int:
        """The height of its lines at ``width`` (its own; before it is laid out: its preferred size's)."""
        if width is None:
            width = self.width() if self.testAttribute(Qt.WidgetAttribute.WA_Resized) else 0
        return self.heightForWidth(width) if width > 0 else self.sizeHint().height()

    def minimumSizeHint(self) -> QSize:
        return QSize(super().minimumSizeHint().width(), self.lines_height())

    def setText(self, text: str) -> None:
        super().setText(text)
        self.updateGeometry()
        if self._then is not None:
            self._then()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():      # another width: another number of lines
            self.updateGeometry()


class SummaryBox(QScrollArea):
    """The test's summary, wrapped to the dialog's width and given the height its lines take (up to
    SUMMARY_LINES; a longer one scrolls): the table gives up room for it, or the dialog grows, and no line
    is ever cut."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.label = FittedLabel(text, then=self.refit)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)   # an error can be copied
        self.setWidget(self.label)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.refit()

    def _room(self) -> tuple[int, int]:
        """The height the summary's lines take at this width (before the box is laid out: at the label's
        own), and the most the box gives them."""
        width = self.contentsRect().width() if self.testAttribute(Qt.WidgetAttribute.WA_Resized) else 0
        return self.label.lines_height(width), SUMMARY_LINES * self.label.fontMetrics().lineSpacing()

    def refit(self) -> None:
        """Ask for the room of the summary's lines; a scroll bar only where they are more than it gives."""
        need, most = self._room()
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if need > most
                                        else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(self.label.sizeHint().width(), min(*self._room()))

    def minimumSizeHint(self) -> QSize:
        return QSize(0, min(*self._room()))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():      # another width: another number of lines
            self.refit()


class LoadTestDialog(QDialog):
    """Runs through ``submit``/``cancel`` (the bridge); feed it ``on_finished`` and ``on_stats``.

    ``prompt_ids(n)`` makes the HTTP path's prompt (n token ids; called on its worker thread);
    ``set_server_url`` says where the local server listens (None: off, and the HTTP choice is disabled).
    """

    finished_test = Signal(object)   # LoadTestSummary

    def __init__(self, submit: Callable[[ReplyRequest], None], cancel: Callable[[str], None], parent=None,
                 prompt_ids: PromptIds | None = None, server_url: str | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Load test")
        self.resize(620, 420)
        self._submit, self._cancel, self._prompt_ids = submit, cancel, prompt_ids
        self.server_url: str | None = None
        self.http_run: HttpLoadRun | None = None    # the latest run through HTTP
        self._via_http = False
        self.ids: list[str] = []
        self._max_tokens = 0            # the output length the running test asked for
        self.results: dict[str, ReplyStats] = {}
        self._read = False              # an engine reading came in while this test ran
        self._context = 0               # the model's context (0: not known)
        lay = QVBoxLayout(self)
        form = QFormLayout()
        self.streams = RangeSpin()
        self.streams.setRange(1, 256)
        self.streams.setValue(4)
        self.prompt_len = RangeSpin()
        self.prompt_len.setRange(1, 32768)
        self.prompt_len.setValue(64)
        self.prompt_len.setSuffix(" tokens")
        self.output_len = RangeSpin()
        self.output_len.setRange(1, 32768)
        self.output_len.setValue(64)
        self.output_len.setSuffix(" tokens")
        form.addRow("Concurrent requests", self.streams)
        form.addRow("Prompt length", self.prompt_len)
        form.addRow("Output length", self.output_len)
        self.range_note = RangeNote()          # a number typed out of range ("✗ 1000 is outside 1–256; ...")
        form.addRow(self.range_note)
        for box in (self.streams, self.prompt_len, self.output_len):
            box.setKeyboardTracking(False)      # a number counts once entered: "1000" never passes for 100
        self.range_note.watch(self.streams, self.prompt_len, self.output_len)
        self.send_through = QComboBox()
        self.send_through.addItems([ENGINE, HTTP])
        form.addRow("Send through", self.send_through)
        lay.addLayout(form)
        self.fit_note = FittedLabel()      # prompt and output past the model's context: what each stream then does
        self.fit_note.setObjectName("knobStatus_off")
        self.fit_note.hide()
        lay.addWidget(self.fit_note)
        for box in (self.prompt_len, self.output_len):
            box.valueChanged.connect(self._check_fit)
        self.send_through.currentIndexChanged.connect(self._check_fit)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)    # the status: "reached max tokens"
        self.table.verticalHeader().hide()
        lay.addWidget(self.table, 1)
        self.live = QLabel("Engine aggregate: —")
        self.summary_box = SummaryBox("Press Start to send the requests at once.")
        self.summary = self.summary_box.label
        lay.addWidget(self.live)
        lay.addWidget(self.summary_box)
        row = QHBoxLayout()
        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("primary")
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.setEnabled(False)
        row.addStretch(1)
        row.addWidget(self.stop_button)
        row.addWidget(self.start_button)
        lay.addLayout(row)
        self.set_server_url(server_url)

    @property
    def running(self) -> bool:
        return bool(self.ids) and len(self.results) < len(self.ids)

    @property
    def through_http(self) -> bool:
        return self.send_through.currentText() == HTTP

    def set_context(self, tokens: int) -> None:
        """The loaded model's context, against which the lengths are checked."""
        self._context = tokens
        self._check_fit()

    def _check_fit(self) -> None:
        need = self.prompt_len.value() + self.output_len.value()
        over = bool(self._context) and need > self._context
        if over:
            what = ("the server refuses each request (400)" if self.through_http else
                    "each stream ends when the context is full, before its output length")
            self.fit_note.setText(f"Prompt and output ({need:,} tokens) are more than the model's {self._context:,}"
                                  f"-token context: {what}; lower them to {self._context:,} together")
        self.fit_note.setVisible(over)

    def set_server_url(self, url: str | None) -> None:
        """The local server's API URL, or None while it is off (the test then goes to the engine)."""
        self.server_url = url
        usable = url is not None and self._prompt_ids is not None
        if not usable:
            self.send_through.setCurrentText(ENGINE)
        self.send_through.setEnabled(usable and not self.running)
        self.send_through.setToolTip(f"Requests go to {url}" if usable else HTTP_OFF_TIP)

    def start(self) -> None:
        """Send every stream at once (EOS ignored so each produces exactly the output length)."""
        for box in (self.streams, self.prompt_len, self.output_len):
            box.interpretText()                        # a number typed but not entered counts
        n = self.streams.value()
        self._max_tokens = self.output_len.value()     # what each stream asks for: the box may change meanwhile
        tag = uuid.uuid4().hex[:6]
        self.ids = [f"load-{tag}-{i}" for i in range(n)]
        self.results = {}
        self._read = False
        self.live.setText("Engine aggregate: —")      # a reading of this test's, not the one before
        self.table.setRowCount(n)
        for i, rid in enumerate(self.ids):
            self._row(i, [str(i + 1), "running", "", "", ""])
        self._via_http = self.through_http and self.server_url is not None and self._prompt_ids is not None
        if self._via_http:
            self._start_http(self.server_url, self._prompt_ids)
            where = f" through {self.server_url}"
        else:
            self._start_engine()
            where = ""
        self.summary.setText(f"Running {n} streams{where}…")
        self.start_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.send_through.setEnabled(False)

    def _start_engine(self) -> None:
        settings = GenerationSettings(temperature=TEMPERATURE, top_p=1.0, top_k=0, max_tokens=self.output_len.value())
        for rid in self.ids:
            self._submit(ReplyRequest(rid, settings, synthetic_prompt_tokens=self.prompt_len.value(),
                                      ignore_eos=True, tag="loadtest"))

    def _start_http(self, url: str, prompt_ids: PromptIds) -> None:
        load = HttpLoad(url, tuple(self.ids), self.prompt_len.value(), self.output_len.value(), TEMPERATURE)
        self.http_run = HttpLoadRun(load, prompt_ids)
        self.http_run.stream_finished.connect(self.on_finished)
        self.http_run.start()

    def stop(self) -> None:
        if self._via_http and self.http_run is not None:
            self.http_run.stop()
            return
        for rid in self.ids:
            if rid not in self.results:
                self._cancel(rid)

    def close_streams(self) -> None:
        """End an HTTP run and wait for its thread (the window is closing, the server goes next)."""
        if self.http_run is not None:
            self.http_run.stop()
            self.http_run.join(CLOSE_WAIT_S)

    def _row(self, i: int, cells: list[str]) -> None:
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(text if c == 1 else "")      # a long status (an error) whole
            self.table.setItem(i, c, item)

    def on_stats(self, stats) -> None:
        if self.running:
            self._read = True
            self.live.setText(f"Engine aggregate: {stats.aggregate_tok_s:.1f} tok/s · batch {stats.batch_size} "
                              f"· queued {stats.waiting}")

    def on_finished(self, r: ReplyStats) -> None:
        """One stream ended; when all have, show aggregate against per-stream speed."""
        if r.request_id not in self.ids:
            return
        self.results[r.request_id] = r
        i = self.ids.index(r.request_id)
        self._row(i, [str(i + 1), r.finish_words(self._max_tokens), str(r.completion_tokens),
                      "—" if r.ttft_ms is None else f"{r.ttft_ms:.0f}",
                      "—" if r.decode_tok_s is None else f"{r.decode_tok_s:.1f}"])
        if len(self.results) == len(self.ids):
            result = summarise(list(self.results.values()))
            self.summary.setText(result.text())
            last = self.live.text().removeprefix("Engine aggregate: ")
            if self._read and last != self.live.text():     # the engine's last reading while it ran, said as such
                self.live.setText(f"Last engine reading of the test: {last}")
            self.start_button.setEnabled(True)
            self.stop_button.setEnabled(False)
            self.set_server_url(self.server_url)
            self.finished_test.emit(result)
