"""The load test's summary: no speeds where every stream failed, the speeds of the streams that finished
where some failed, and the whole line readable in the dialog at its first size, with a larger font and
with a long error, on a 1024x640 screen."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.load_test import SUMMARY_LINES, LoadTestDialog, summarise
from app.messages import ReplyStats

ERROR = "the server answered 400: prompt and max_tokens are 1 token over the 512-token context; shorten it"


def _stream(i: int, error: str | None = None, tokens: int = 64, finished: float = 2.0) -> ReplyStats:
    return ReplyStats(f"s{i}", "loadtest", "error" if error else "length", completion_tokens=tokens,
                      decode_tok_s=29.5, started=0.0, finished=finished, error=error)


def test_a_load_test_where_every_stream_failed_gives_no_speeds_only_the_failure():
    summary = summarise([_stream(i, ERROR) for i in range(4)])
    assert summary.failed == 4 and summary.aggregate_tok_s == 0 and summary.per_stream_tok_s == 0
    text = summary.text()
    assert text == f"4 streams, 256 tokens — every stream failed: {ERROR}"
    assert "tok/s" not in text and "batching" not in text


def test_a_load_test_where_some_streams_failed_gives_the_speeds_of_those_that_finished():
    # two finish in 2 s with 64 tokens each; two fail at 8 s with 10 tokens: their time and tokens are left out
    summary = summarise([_stream(0), _stream(1), _stream(2, ERROR, 10, 8.0), _stream(3, ERROR, 10, 8.0)])
    assert summary.wall_s == 2.0 and summary.aggregate_tok_s == 64.0 and summary.per_stream_tok_s == 29.5
    assert summary.text() == ("4 streams, of which the 2 that finished made 128 tokens in 2.0 s: aggregate "
                              "64.0 tok/s vs 29.5 tok/s per stream (2.17× from batching) — 2 of 4 streams "
                              f"failed: {ERROR}")


def _finished_dialog(error: str, font_pt: int | None = None) -> LoadTestDialog:
    """A dialog at its first size, shown, whose test of 4 streams ended: the first reached its length, the
    others failed with ``error``."""
    dialog = LoadTestDialog(lambda _r: None, lambda _r: None)
    if font_pt:                                          # a larger desktop font than the style sheet's 10 pt
        dialog.setStyleSheet(f"QWidget {{ font-size: {font_pt}pt; }}")
    dialog.set_context(512)
    dialog.prompt_len.setValue(4096)                     # the note over the table shows too
    dialog.show()
    dialog.start()
    for i, rid in enumerate(dialog.ids):
        dialog.on_finished(ReplyStats(rid, "loadtest", "error" if i else "length", completion_tokens=64,
                                      started=0.0, finished=2.0, decode_tok_s=29.5, error=error if i else None))
    for _ in range(3):
        QApplication.processEvents()
    return dialog


def _whole(dialog: LoadTestDialog) -> bool:
    """Whether every line of the summary has its room in the dialog (scrolled to where it is longer)."""
    box, label = dialog.summary_box, dialog.summary
    lines = label.heightForWidth(box.viewport().width())
    shown = min(lines, SUMMARY_LINES * label.fontMetrics().lineSpacing())
    inside = dialog.rect().contains(box.geometry())
    return inside and box.viewport().height() >= shown and label.height() >= lines


def test_the_summary_is_shown_whole_at_the_dialogs_first_size(qapp, themed, qtbot):
    dialog = _finished_dialog(ERROR)
    qtbot.addWidget(dialog)
    assert (dialog.width(), dialog.height()) == (620, 420)
    assert "3 of 4 streams failed" in dialog.summary.text() and _whole(dialog)
    assert not dialog.summary_box.verticalScrollBar().isVisible()
    for spin in (dialog.streams, dialog.prompt_len, dialog.output_len):     # nothing above it squeezed either
        assert spin.height() >= spin.minimumSizeHint().height()


def test_with_a_larger_font_the_dialog_grows_to_show_the_summary_and_stays_on_a_small_screen(qapp, themed, qtbot):
    dialog = _finished_dialog(ERROR, font_pt=13)
    qtbot.addWidget(dialog)
    assert _whole(dialog) and dialog.fit_note.height() >= dialog.fit_note.heightForWidth(dialog.fit_note.width())
    for spin in (dialog.streams, dialog.prompt_len, dialog.output_len):
        assert spin.height() >= spin.minimumSizeHint().height()
    long = _finished_dialog(" ".join([ERROR] * 8), font_pt=13)        # a long error scrolls
    qtbot.addWidget(long)
    assert _whole(long) and long.summary_box.verticalScrollBar().isVisible()
    assert long.height() <= 600                                       # a 1024x640 screen, less its panel


def test_a_number_typed_outside_a_boxs_range_is_said_and_the_box_keeps_its_value(qapp, qtbot):
    # Qt dropped the keystroke that took "1000" past 256 and showed 100 without a word
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    dialog = LoadTestDialog(lambda _r: None, lambda _r: None)
    qtbot.addWidget(dialog)
    dialog.show()
    for spin, typed, line in ((dialog.streams, "1000", "✗ 1000 is outside 1–256; it stays 4"),
                              (dialog.output_len, "0", "✗ 0 is outside 1–32768; it stays 64")):
        spin.lineEdit().selectAll()
        QTest.keyClicks(spin, typed)
        QTest.keyClick(spin, Qt.Key.Key_Return)
        assert dialog.range_note.text() == line and dialog.range_note.isVisibleTo(dialog)
    assert (dialog.streams.value(), dialog.output_len.value()) == (4, 64)
    QTest.keyClicks(dialog.prompt_len, "9")            # typing into another box: the line was about this one
    assert dialog.range_note.isHidden()
    dialog.prompt_len.lineEdit().selectAll()
    QTest.keyClicks(dialog.prompt_len, "128")          # typed, not entered: Start takes it
    dialog.start()
    assert dialog.prompt_len.value() == 128 and len(dialog.ids) == 4
