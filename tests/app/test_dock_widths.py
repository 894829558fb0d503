"""A window made narrow and wide again gives its panels and knobs back the width the shrink took; the chat
takes the rest. One that starts narrow has nothing to give back, and a divider the user drags is kept."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt

from tests.app.test_window_layout import _settle

WIDE, NARROW = QSize(1680, 1000), QSize(1024, 660)


def _widths(w) -> tuple[int, int, int]:
    """The chat's (the central widget's), the front panel's and the knobs' widths."""
    return w.centralWidget().width(), w.dock_widths.front_panel().width(), w.docks["knobs"].width()


def _resize(w, size: QSize) -> None:
    w.resize(size)
    for _ in range(3):
        _settle()


def test_panels_and_knobs_get_back_what_a_shrink_took(window):
    _resize(window, WIDE)
    window.apply_default_layout(WIDE)
    _settle()
    wide = _widths(window)
    _resize(window, NARROW)
    chat, panels, knobs = _widths(window)
    assert panels < wide[1] and knobs <= wide[2]          # the shrink took from the docks
    _resize(window, WIDE)
    assert _widths(window) == wide
    _resize(window, WIDE + QSize(200, 0))                 # wider than ever: the chat takes what is new
    assert _widths(window)[1:] == wide[1:] and _widths(window)[0] == wide[0] + 200


def test_a_window_that_starts_narrow_gives_the_chat_what_it_grows_by(window):
    _resize(window, NARROW)
    window.apply_default_layout(NARROW)
    _settle()
    chat, panels, knobs = _widths(window)
    _resize(window, NARROW + QSize(300, 0))
    assert _widths(window) == (chat + 300, panels, knobs)


def test_a_divider_the_user_drags_is_the_width_given_back(window):
    _resize(window, WIDE)
    window.apply_default_layout(WIDE)
    _settle()
    front = window.dock_widths.front_panel()
    window.resizeDocks([front], [front.width() + 120], Qt.Orientation.Horizontal)     # the user drags
    _settle()
    dragged = _widths(window)
    _resize(window, NARROW)
    _resize(window, WIDE)
    assert _widths(window) == dragged


def test_a_window_dragged_narrow_and_wide_in_steps_gives_the_docks_back_their_widths(window):
    # each step's give-back changes the chat's width while the window's stays: it was taken for the user
    # dragging a divider, and the docks came back at the widths they had half-way
    _resize(window, WIDE)
    window.apply_default_layout(WIDE)
    _settle()
    wide = _widths(window)
    for width in range(WIDE.width(), NARROW.width(), -80):
        _resize(window, QSize(width, WIDE.height()))
    _resize(window, QSize(NARROW.width(), WIDE.height()))
    for width in range(NARROW.width(), WIDE.width(), 80):
        _resize(window, QSize(width, WIDE.height()))
    _resize(window, WIDE)
    assert _widths(window) == wide


def test_a_divider_dragged_after_the_window_grew_in_a_burst_is_kept(window):
    # a give-back whose layout came with the window's next step left its widths behind, and the user's next
    # drag, within them, was taken for that give-back's layout and not kept
    _resize(window, WIDE)
    window.apply_default_layout(WIDE)
    _settle()
    _resize(window, NARROW)
    window.resize(QSize(WIDE.width() - 80, WIDE.height()))
    window.dock_widths._give_back()                 # as its timer would, before Qt lays the window out
    _resize(window, WIDE)
    front = window.dock_widths.front_panel()
    window.resizeDocks([front], [front.width() - 40], Qt.Orientation.Horizontal)      # the user drags
    _settle()
    dragged = _widths(window)
    _resize(window, NARROW)
    _resize(window, WIDE)
    assert _widths(window) == dragged
