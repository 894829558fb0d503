"""A layout saved on a bigger screen: resetting the layout on a smaller one (View › Reset window layout)
leaves it saved."""
from __future__ import annotations

from PySide6.QtCore import QSettings

from tests.app.test_window_layout import (_closed_on_a_big_screen, _opened_on_the_small_screen, _saved, _settle,
                                          _stacked_again_on_the_big_screen)


def test_reset_window_layout_keeps_the_big_screens_layout(qtbot, tmp_path, themed):
    saved = _closed_on_a_big_screen(qtbot, tmp_path)
    small = _opened_on_the_small_screen(qtbot, tmp_path)
    small.reset_layout()                                                      # View › Reset window layout
    _settle()
    assert small.layout_slot == "smaller"
    small.close()
    assert _saved(tmp_path) == saved
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    assert settings.value("smaller_screen/window_state") is not None      # the reset layout, for this screen
    assert _stacked_again_on_the_big_screen(qtbot, tmp_path)


def test_reset_window_layout_fits_the_window_as_it_is_not_the_screen(window):
    """A window made small on a large screen: Reset window layout gives the panels one tab group, as a
    first window of that size has them, not the two groups one over the other that squeeze its plots."""
    from PySide6.QtCore import QSize

    from tests.app.test_window_layout import SCREENS, _client
    w = window
    w.resize(_client(SCREENS[1]))
    w.apply_default_layout(SCREENS[1])
    _settle()
    docks = w.docks
    assert docks["memory"] not in w.tabifiedDockWidgets(docks["performance"])     # two groups on the large window
    w.resize(QSize(1100, 650))
    _settle()
    w.reset_layout()
    _settle()
    tabbed = set(w.tabifiedDockWidgets(docks["performance"]))
    assert {docks[n] for n in ("gpu", "memory", "experts", "traffic")} <= tabbed
    plot = docks["performance"].geometry()
    assert plot.height() > 0.8 * w.centralWidget().height()      # the front panel spans the window's height


def _ghost_tab_bars(w) -> list[str]:
    """Tab bars of the window shown that belong to no tab group of its docks now (left by a layout that
    gave way to another), by their tabs' titles."""
    from PySide6.QtWidgets import QTabBar
    groups = []
    for dock in w.docks.values():
        group = sorted(d.windowTitle() for d in [dock, *w.tabifiedDockWidgets(dock)] if not d.isFloating())
        if len(group) > 1 and group not in groups:
            groups.append(group)
    ghosts = []
    for bar in w.findChildren(QTabBar):
        titles = sorted(bar.tabText(i) for i in range(bar.count()))
        if bar.isVisible() and (titles not in groups or bar.geometry().top() < w.menuBar().height()):
            ghosts.append(", ".join(titles) or "an empty bar")
    return ghosts


def test_a_layout_that_gives_way_to_another_leaves_no_tab_bar_of_its_own_behind(qtbot, tmp_path, themed):
    # the big screen's two panel groups, restored and then replaced by the small screen's one: their tab
    # bars stayed on screen, over the File and Chat menus, and took Tab focus
    _closed_on_a_big_screen(qtbot, tmp_path)
    small = _opened_on_the_small_screen(qtbot, tmp_path)
    qtbot.waitUntil(lambda: _ghost_tab_bars(small) == [], timeout=3000)
    assert type(small.childAt(12, 9)).__name__ == "QMenuBar"
    small.close()
    again = _opened_on_the_small_screen(qtbot, tmp_path)        # the smaller screen's own layout, restored
    qtbot.waitUntil(lambda: _ghost_tab_bars(again) == [], timeout=3000)
    assert type(again.childAt(12, 9)).__name__ == "QMenuBar"
    again.close()


def test_the_window_opens_with_the_message_box_ready_for_typing(window):
    assert window.focusWidget() is window.chat_pane.input


def test_a_first_window_shows_the_tabs_of_every_panel(window, qtbot):
    from PySide6.QtWidgets import QTabBar
    window.show()
    titles = {d.windowTitle() for n, d in window.docks.items() if n != "knobs"}

    def panel_bar():
        return next((b for b in window.findChildren(QTabBar) if b.isVisible()
                     and {b.tabText(i) for i in range(b.count())} == titles), None)
    qtbot.waitUntil(lambda: panel_bar() is not None, timeout=3000)
    qtbot.wait(200)                       # the leftover bars' tidy has run by now: the panels' bar stays
    assert panel_bar() is not None
