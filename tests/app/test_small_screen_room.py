"""On a 1024 × 700 screen the transcript keeps a readable height: the load's banners and the demo's notice give
way first (the banners shrink and scroll, the notice folds to one line with a "more" button)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.banner import CHAT_ROOM_LINES
from app.chat_pane import VIEW_MIN_LINES
from tests.app.test_window_layout import NOTES, SMALL_SCREEN, _client, _settle


def _view_lines(w) -> float:
    return w.chat_pane.view.viewport().height() / w.chat_pane.view.fontMetrics().lineSpacing()


def test_the_transcript_keeps_its_lines_under_the_banners_on_a_small_screen(window):
    w = window
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(_client(SMALL_SCREEN))
    _settle()
    alone = _view_lines(w)
    for i in range(3):
        w.banners.show_message(f"note{i}", NOTES[i], "amber")
    _settle()
    least, line = w.banners.minimumSizeHint().height(), w.banners.fontMetrics().lineSpacing()
    assert w.banners.height() <= least + CHAT_ROOM_LINES * line        # the banners gave way first
    assert w.banners.verticalScrollBar().maximum() > 0                       # and scroll
    assert _view_lines(w) >= VIEW_MIN_LINES + 2 and alone >= VIEW_MIN_LINES + 2
    for _ in range(3):                       # the smallest window: the transcript still has its least lines
        w.resize(w.minimumSizeHint())
        _settle()
    assert _view_lines(w) >= VIEW_MIN_LINES - 1


def test_the_demo_notice_is_one_line_that_opens_whole(window):
    pane = window.chat_pane
    note = pane.notice
    assert "Small demo model" in note.text() and note.isVisible()
    line = note.label.fontMetrics().lineSpacing()
    assert note.height() < 2 * line + 8 and note.label.toolTip() in ("", note.text())
    folded = pane.view.height()
    note.toggle.click()
    _settle()
    assert note.whole.isVisible() and not note.label.isVisible() and note.toggle.text() == "less"
    assert pane.view.height() <= folded
    note.toggle.click()
    _settle()
    assert note.label.isVisible() and not note.whole.isVisible()


def test_the_panels_tabs_show_their_titles_whole_on_a_small_screen(window):
    # five tabs in a narrow dock: whole titles and scroll arrows, never "Throu…" and "M…"
    from PySide6.QtWidgets import QTabBar
    w = window
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(_client(SMALL_SCREEN))
    _settle()
    bars = [b for b in w.findChildren(QTabBar) if b.isVisible() and b.count() >= 5]
    assert bars
    for bar in bars:
        assert bar.elideMode() == Qt.TextElideMode.ElideNone and bar.usesScrollButtons()
        for i in range(bar.count()):
            assert bar.tabRect(i).width() > bar.fontMetrics().horizontalAdvance(bar.tabText(i))
