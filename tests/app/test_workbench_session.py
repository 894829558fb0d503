"""Event-loop responsiveness while streaming, recording/export, the load test and --screenshot."""
from __future__ import annotations

import csv
import gc
import time

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtGui import QImage

from app.launch import SCREENSHOT_SIZE, run_gui
from app.messages import GenerationSettings
from app.paths import default_model_dir

REPLY_MS = 120_000
PROBE_MS = 5


def test_event_loop_never_stalls_while_a_reply_streams(window, qtbot):
    """A 5 ms timer measures how late the GUI thread is while text streams and the plots redraw."""
    # Guards the requirement: no GUI stall over 50 ms while a reply streams at full speed. What keeps
    # it true: fixed plot ranges moved only when the data outgrows them (no pyqtgraph auto-range or axis
    # tick pass per paint), readouts and the GPU panel's style touched only on a change, the streaming tail
    # appended with a cursor (no re-layout of the transcript per text delta), readouts and status text whose
    # width never follows their text (no window re-layout per stats sample), and an engine thread that
    # is nicer than the GUI thread and lets go of the GIL after every step. Not to be loosened: on a
    # machine this test fails on, the app freezes visibly.
    # greedy: the demo model's greedy continuation of this prompt runs the full 200 tokens (no early stop)
    window.chat_pane.settings_box.set_settings(GenerationSettings(temperature=0.0, top_k=0, top_p=1.0, max_tokens=200))
    gc.collect()   # garbage of earlier tests in this process is not this window's to pay for
    gaps: list[float] = []
    last = [time.perf_counter()]

    def probe() -> None:
        now = time.perf_counter()
        gaps.append((now - last[0]) * 1000.0 - PROBE_MS)
        last[0] = now

    timer = QTimer()
    timer.timeout.connect(probe)
    redraws = [0]
    window.redraw_timer.timeout.connect(lambda: redraws.__setitem__(0, redraws[0] + 1))
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS) as done:
        window.chat.send("In the beginning God created")
        last[0] = time.perf_counter()
        timer.start(PROBE_MS)
    timer.stop()
    stall = np.array(gaps[1:])
    p99, worst = float(np.percentile(stall, 99)), float(stall.max())
    print(f"\nevent-loop stall over {len(stall)} probes, {done.args[0].completion_tokens} tokens, "
          f"{redraws[0]} redraws: p99 {p99:.1f} ms, max {worst:.1f} ms")
    assert done.args[0].completion_tokens > 20 and redraws[0] > 5
    assert worst < 50.0, f"the GUI froze for {worst:.0f} ms (p99 {p99:.1f} ms)"


def test_session_csv_and_plot_png_export(window, qtbot, tmp_path):
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_MS):
        window.chat.send("Blessed are")
    qtbot.waitUntil(lambda: len(window.recorder.rows) >= 3, timeout=10_000)
    path = tmp_path / "session.csv"
    n = window.recorder.write_csv(path)
    rows = list(csv.DictReader(path.open()))
    assert n == len(rows) >= 3
    assert max(float(r["decode_tok_s"]) for r in rows) > 0
    assert rows[-1]["gpu_temp_c"] == "55.0" and rows[-1]["gpu_mem_temp_c"] == ""   # unsupported stays empty
    for panel in window.panels:
        png = tmp_path / f"{type(panel).__name__}.png"
        panel.export_png(str(png))
        image = QImage(str(png))
        assert not image.isNull() and image.width() > 100 and image.height() > 100


def test_load_test_reports_aggregate_against_per_stream(window, qtbot):
    window.open_load_test()
    dialog = window.load_test
    dialog.streams.setValue(3)
    dialog.prompt_len.setValue(16)
    dialog.output_len.setValue(12)
    with qtbot.waitSignal(dialog.finished_test, timeout=REPLY_MS) as done:
        dialog.start_button.click()
    summary = done.args[0]
    assert summary.streams == 3 and summary.total_tokens == 36     # EOS ignored: exactly 12 each
    assert summary.aggregate_tok_s > 0 and summary.per_stream_tok_s > 0
    assert "aggregate" in dialog.summary.text() and "per stream" in dialog.summary.text()
    assert [dialog.table.item(i, 2).text() for i in range(3)] == ["12", "12", "12"]


def test_screenshot_mode_writes_a_png_of_the_window(qapp, tmp_path):
    out = tmp_path / "shot.png"
    code = run_gui(str(default_model_dir()), {"device": "cpu"}, screenshot=str(out), prompt="And the earth")
    assert code == 0
    image = QImage(str(out))
    assert out.stat().st_size > 10_000
    assert (image.width(), image.height()) == (SCREENSHOT_SIZE.width(), SCREENSHOT_SIZE.height())
