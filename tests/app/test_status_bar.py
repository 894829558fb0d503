"""The window's status bar: a message that outlives the server switching on and off, and slots that share
a narrow window without squeezing one another to nothing or re-laying out ten times a second."""
from __future__ import annotations

from types import SimpleNamespace

from PySide6.QtWidgets import QApplication

from app.status_line import LEAST_MODEL_PX, speed_line
from tests.app.test_local_server import _serve

BUSY = SimpleNamespace(running=16, waiting=12, decode_tok_s=1234.5, aggregate_tok_s=12345.6)


def _quiet(w) -> None:
    """The engine's own stats (~10 Hz, idle) no longer reach the speed slot: the test sets its lines."""
    w.bridge.stats.disconnect(w.on_stats)
    _settle()


def _settle() -> None:
    for _ in range(3):
        QApplication.processEvents()


def test_a_message_outlives_the_server_turning_on_and_off(window, qtbot):
    w = window
    w.show_message("Saved /home/me/chat.md", 60_000)
    _serve(w, qtbot)
    _settle()
    assert w.status_model.text() == "Saved /home/me/chat.md"
    w._set_status_model("Loading other…")                 # the model's line changes under the message
    w.server.set_on(False)
    qtbot.waitUntil(lambda: not w.server.status.isVisible(), timeout=30_000)
    assert w.status_model.text() == "Saved /home/me/chat.md" and w.status_model.isVisible()
    w.status_model.clear_message()                        # what the message's timer does when it ends
    assert w.status_model.text() == "Loading other…"
    w.show_message("gone soon", 50)
    qtbot.waitUntil(lambda: w.status_model.text() == "Loading other…", timeout=5_000)


def test_a_long_message_is_cut_in_the_middle_so_the_file_name_stays(window):
    w = window
    w.resize(w.minimumSizeHint().width(), 700)
    saved = "Saved /home/someone/Documents/strata-exports/" + "deep/" * 12 + "My chat.md"
    w.show_message(saved, 60_000)
    _settle()
    shown = w.status_model.shown_text()
    assert "…" in shown and shown.startswith("Saved /home") and shown.endswith("My chat.md")
    assert w.status_model.toolTip() == saved


def test_at_the_narrowest_window_every_slot_keeps_room(window, qtbot):
    w = window
    _serve(w, qtbot)
    _quiet(w)
    w.resize(w.minimumSizeHint().width(), 700)
    w._set_speed(speed_line(BUSY))
    _settle()
    bar, speed = w.statusBar(), w.status_speed
    assert w.status_model.width() >= LEAST_MODEL_PX            # the model's name (and messages) stay readable
    for slot in (w.status_model, w.server.status, speed, w.status_gpu):
        assert slot.isVisible() and slot.geometry().right() <= bar.width()
    assert speed.width() <= speed.share * w.width() + 1
    assert speed.shown_text().endswith("…") and speed.toolTip() == speed_line(BUSY)    # whole on hover


def test_the_speed_slot_keeps_its_width_while_numbers_change_and_shrinks_when_idle(window):
    w = window
    _quiet(w)
    w.resize(1600, 900)
    w._set_speed(speed_line(BUSY))
    _settle()
    wide = w.status_speed.width()
    w._set_speed(speed_line(SimpleNamespace(running=1, waiting=0, decode_tok_s=5.1, aggregate_tok_s=5.1)))
    _settle()
    assert w.status_speed.width() == wide
    w._set_speed(speed_line(SimpleNamespace(running=0, waiting=0, decode_tok_s=0.0, aggregate_tok_s=0.0)))
    _settle()
    assert w.status_speed.text() == "idle" and w.status_speed.width() < wide
