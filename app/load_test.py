"""Load test: N concurrent synthetic requests; aggregate tok/s against per-stream tok/s.

The requests go to the engine directly (through the bridge) or, while the local server is on, through
HTTP to it (:mod:`app.http_load`): the same table and summary, with the HTTP path's own overhead in it.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QFormLayout, QHBoxLayout, QHeaderView, QLabel, QPushButton,
                               QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout)

from app.http_load import HttpLoad, HttpLoadRun, PromptIds
from app.local_server import SWITCH_MENU
from app.messages import GenerationSettings, ReplyRequest, ReplyStats

COLUMNS = ("Stream", "Status", "Tokens", "TTFT (ms)", "Decode tok/s")
ENGINE, HTTP = "Engine directly", "Local HTTP server"
HTTP_OFF_TIP = f"Turn on {SWITCH_MENU} to send the load test through HTTP."
TEMPERATURE = 0.8
CLOSE_WAIT_S = 10.0          # what a closing window gives the HTTP streams to end


@dataclass(frozen=True)
class LoadTestSummary:
    streams: int
    total_tokens: int
    wall_s: float
    aggregate_tok_s: float
    per_stream_tok_s: float      # mean decode speed of one stream
    failed: int = 0              # streams that ended in an error
    first_error: str = ""        # the first of their errors
    stopped: int = 0             # streams stopped by the user before their output length

    def text(self) -> str:
        head = (f"{self.streams} streams, {self.total_tokens} tokens in {self.wall_s:.1f} s: aggregate "
                f"{self.aggregate_tok_s:.1f} tok/s vs {self.per_stream_tok_s:.1f} tok/s per stream "
                f"({self.aggregate_tok_s / self.per_stream_tok_s:.2f}× from batching)"
                if self.per_stream_tok_s > 0 else f"{self.streams} streams, {self.total_tokens} tokens")
        if self.stopped:
            which = "every stream" if self.stopped == self.streams else f"{self.stopped} of {self.streams} streams"
            head = f"Stopped: {which} ended early. {head}"
        if not self.failed:
            return head
        which = "every stream" if self.failed == self.streams else f"{self.failed} of {self.streams} streams"
        return f"{head} — {which} failed: {self.first_error}"


def summarise(results: list[ReplyStats]) -> LoadTestSummary:
    """Aggregate = all tokens over the wall time of the whole test; per stream = mean decode speed."""
    tokens = sum(r.completion_tokens for r in results)
    wall = max(r.finished for r in results) - min(r.started for r in results) if results else 0.0
    speeds = [r.decode_tok_s for r in results if r.decode_tok_s]
    failed = [r for r in results if r.finish_reason == "error" or r.error]
    stopped = sum(1 for r in results if r.finish_reason == "abort")
    return LoadTestSummary(len(results), tokens, wall, tokens / wall if wall > 0 else 0.0,
                           sum(speeds) / len(speeds) if speeds else 0.0, len(failed),
                           (failed[0].error or "the reply failed") if failed else "", stopped)


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
        self.streams = QSpinBox()
        self.streams.setRange(1, 256)
        self.streams.setValue(4)
        self.prompt_len = QSpinBox()
        self.prompt_len.setRange(1, 32768)
        self.prompt_len.setValue(64)
        self.prompt_len.setSuffix(" tokens")
        self.output_len = QSpinBox()
        self.output_len.setRange(1, 32768)
        self.output_len.setValue(64)
        self.output_len.setSuffix(" tokens")
        form.addRow("Concurrent requests", self.streams)
        form.addRow("Prompt length", self.prompt_len)
        form.addRow("Output length", self.output_len)
        self.send_through = QComboBox()
        self.send_through.addItems([ENGINE, HTTP])
        form.addRow("Send through", self.send_through)
        lay.addLayout(form)
        self.fit_note = QLabel("")       # prompt and output past the model's context: what each stream then does
        self.fit_note.setObjectName("knobStatus_off")
        self.fit_note.setWordWrap(True)
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
        self.summary = QLabel("Press Start to send the requests at once.")
        self.summary.setWordWrap(True)
        lay.addWidget(self.live)
        lay.addWidget(self.summary)
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
