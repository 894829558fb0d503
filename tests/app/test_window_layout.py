"""The window fits a small screen (1024 × 700), a laptop's and a large one: every dock reachable, inside the
window, none over another, no button over another, no plot title cut; a layout saved on a bigger screen is
fitted to a smaller one, or gives way there to the default layout and stays saved for its own screen; a
screenshot at the smallest size the flag takes is that size."""
from __future__ import annotations

import itertools

import pytest
from PySide6.QtCore import QPoint, QRect, QSettings, QSize, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QAbstractButton, QApplication, QDockWidget, QTabBar, QWidget

from app.bridge import EngineBridge
from app.conversations import ConversationStore
from app.gpu_poller import FakeMonitor, GpuPoller, GpuSample
from app.launch import run_gui
from app.main_window import MainWindow
from app.paths import default_model_dir
from app.window_layout import LAYOUT_VERSION, fit_rect
from strata.cli import SMALLEST_WINDOW

# what a desktop takes from a screen around the window: its frame and title bar, a task bar
FRAME = QSize(16, 40)
TASKBAR = 40
SCREENS = (QSize(1366, 768), QSize(1920, 1080))


def _client(screen: QSize) -> QSize:
    """The window's inside on ``screen`` once frame and task bar are taken."""
    return QSize(screen.width() - FRAME.width(), screen.height() - TASKBAR - FRAME.height())


def _settle() -> None:
    for _ in range(3):
        QApplication.processEvents()


def _on_window(w: MainWindow) -> dict[str, QRect]:
    """The docked docks shown now (a dock in a tab group that is not in front lies outside the window)."""
    inside = w.rect()
    return {name: d.geometry() for name, d in w.docks.items()
            if d.isVisible() and not d.isFloating() and inside.intersects(d.geometry())}


def _check_docks(w: MainWindow) -> None:
    shown = _on_window(w)
    for name, geo in shown.items():
        assert w.rect().contains(geo), f"{name} dock {geo} leaves the window {w.rect()}"
        dock = w.docks[name]
        assert geo.width() >= dock.minimumSizeHint().width() and geo.height() >= dock.minimumSizeHint().height()
    for (a, ga), (b, gb) in itertools.combinations(shown.items(), 2):
        assert not ga.intersects(gb), f"the {a} and {b} docks overlap: {ga} and {gb}"
    central = w.centralWidget().geometry()
    assert central.width() >= w.chat_pane.minimumWidth()
    for name, geo in shown.items():
        assert not geo.intersects(central), f"the {name} dock covers the chat"


@pytest.mark.parametrize("screen", SCREENS, ids=lambda s: f"{s.width()}x{s.height()}")
def test_every_dock_is_reachable_and_inside_the_window(window, screen):
    w = window
    client = _client(screen)
    hint = w.minimumSizeHint()
    assert hint.width() <= client.width() and hint.height() <= client.height(), (hint, client)
    w.resize(client)
    w.apply_default_layout(screen)
    _settle()
    assert w.size() == client
    assert set(_on_window(w)) >= {"knobs", "performance"}
    for name, dock in w.docks.items():                 # each tab brought to the front in turn
        dock.raise_()
        _settle()
        assert name in _on_window(w), f"the {name} dock cannot be brought into the window"
        _check_docks(w)
    # the knobs scroll: the last of them can be brought into view
    w.knobs_scroll.ensureWidgetVisible(w.knobs.guard_resume)
    _settle()
    viewport = w.knobs_scroll.viewport()
    spot = w.knobs.guard_resume.mapTo(viewport, w.knobs.guard_resume.rect().center())
    assert viewport.rect().contains(spot)
    assert w.knobs.width() <= viewport.width()          # no knob is cut off at the side


def test_a_large_screen_shows_two_panel_groups_beside_the_knobs(window):
    w = window
    w.resize(_client(SCREENS[1]))
    w.apply_default_layout(SCREENS[1])
    _settle()
    shown = _on_window(w)
    assert {"performance", "memory", "knobs"} <= set(shown)
    assert shown["performance"].bottom() < shown["memory"].top()       # one over the other
    assert shown["knobs"].left() > shown["performance"].right()


def test_status_lines_and_status_bar_never_widen_the_window(window, qtbot):
    w = window
    before = w.minimumSizeHint().width()
    long = "✗ rejected: " + "a very long reason from the engine " * 12
    w.knobs._set_status("prefill_chunk", "bad", long)
    w._set_status_model("Loading " + "/a/very/long/path" * 30 + "… (the current model keeps running)")
    _settle()
    assert w.minimumSizeHint().width() == before
    line = w.knobs.status["prefill_chunk"]
    assert line.text() == long and line.toolTip() == long               # the whole text on hover
    assert line.shown_text().endswith("…") and len(line.shown_text()) < len(long)
    assert w.status_model.toolTip().endswith("(the current model keeps running)")


def test_panels_shrink_to_two_readout_columns(window):
    w = window
    w.resize(_client(SCREENS[0]))
    w.apply_default_layout(SCREENS[0])
    _settle()
    assert w.performance.readout_columns() == 4
    dock = w.docks["performance"]
    w.resizeDocks([dock], [dock.minimumSizeHint().width()], Qt.Orientation.Horizontal)
    _settle()
    assert w.performance.width() < 300
    assert w.performance.readout_columns() == 2          # the readouts stack instead of widening the dock
    for panel in w.panels:
        assert panel.minimumSizeHint().width() <= 260, type(panel).__name__


def _bare_window(qtbot, tmp_path) -> MainWindow:
    """A window that loads no model (the layout is all these tests need)."""
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    poller = GpuPoller(FakeMonitor(GpuSample(timestamp=0.0, status="Fake GPU")), interval_ms=1000)
    w = MainWindow(EngineBridge(), poller, settings, ConversationStore(tmp_path / "conversations"))
    qtbot.addWidget(w)
    return w


def test_a_layout_saved_on_a_big_screen_fits_a_small_one(qtbot, tmp_path, themed):
    big = _bare_window(qtbot, tmp_path)
    big.setGeometry(1200, 700, 2500, 1400)
    big.show()
    knobs = big.docks["knobs"]
    knobs.setFloating(True)
    knobs.setGeometry(2300, 900, 420, 900)               # a floating dock far to the right
    _settle()
    big.close()                                          # saves geometry and dock layout

    small = _bare_window(qtbot, tmp_path)
    small.show()
    # a screen smaller than the one it was saved on (and inside the test platform's own 800 x 800 one, which
    # places floating windows itself)
    screen = QRect(0, 0, 800, 600)
    small.restore_layout(screen)
    _settle()
    assert small.docks["knobs"].isFloating()             # the saved layout was restored ...
    assert screen.contains(small.docks["knobs"].geometry())            # ... and pulled onto the screen
    geo, least = small.geometry(), small.minimumSizeHint()
    assert screen.contains(geo.topLeft())
    assert geo.width() <= max(screen.width(), least.width()) and geo.height() <= max(screen.height(), least.height())
    _check_docks(small)
    small.close()


def test_a_layout_from_an_older_window_is_not_restored(qtbot, tmp_path, themed):
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    old = _bare_window(qtbot, tmp_path)
    old.docks["memory"].setFloating(True)
    state = old.saveState()                             # as the window before LAYOUT_VERSION saved it
    assert LAYOUT_VERSION != 0
    old.close()
    settings.setValue("window_state", state)
    settings.sync()
    w = _bare_window(qtbot, tmp_path)
    assert not w.docks["memory"].isFloating()            # the default layout instead
    assert w.tabifiedDockWidgets(w.docks["performance"])
    w.close()


@pytest.mark.parametrize("rect, expected", [
    (QRect(1200, 700, 2500, 1400), QRect(0, 0, 1366, 768)),         # bigger than the screen: shrunk, moved on
    (QRect(2000, 100, 400, 300), QRect(966, 100, 400, 300)),         # off to the right: moved back
    (QRect(-500, -200, 400, 300), QRect(0, 0, 400, 300)),            # off to the top left
    (QRect(100, 100, 400, 300), QRect(100, 100, 400, 300)),          # inside: left alone
])
def test_fit_rect_keeps_a_rect_on_the_screen(rect, expected):
    assert fit_rect(rect, QRect(0, 0, 1366, 768), QSize(100, 100)) == expected


def test_fit_rect_never_goes_below_the_minimum():
    assert fit_rect(QRect(0, 0, 3000, 2000), QRect(0, 0, 800, 600), QSize(1000, 500)).size() == QSize(1000, 600)


def test_the_smallest_window_the_screenshot_flag_takes_is_one_the_window_lays_out(window):
    hint = window.minimumSizeHint()                  # the demo model's window, its notice on show
    assert hint.width() <= SMALLEST_WINDOW[0] and hint.height() <= SMALLEST_WINDOW[1], hint


@pytest.mark.parametrize("size", [SMALLEST_WINDOW, (1024, 700)], ids=["smallest", "1024x700"])
def test_a_screenshot_at_a_small_size_is_that_size(themed, tmp_path, size):
    out = tmp_path / "shot.png"
    assert run_gui(str(default_model_dir()), {"device": "cpu"}, screenshot=str(out), screenshot_size=size) == 0
    image = QImage(str(out))
    assert (image.width(), image.height()) == size


def test_the_screenshot_size_flag_takes_a_small_screen_and_names_the_smallest_size(tmp_path, capsys, monkeypatch):
    import main
    taken: list[tuple[int, int]] = []
    monkeypatch.setattr("strata.cli._window_cannot_open", lambda argv: False)
    monkeypatch.setattr("app.launch.run_gui",
                        lambda *args, screenshot_size=None, **kw: taken.append(screenshot_size) or 0)
    shot = str(tmp_path / "x.png")
    least = f"{SMALLEST_WINDOW[0]}x{SMALLEST_WINDOW[1]}"
    for size in ("1024x700", least):
        assert main.main(["gui", "--screenshot", shot, "--screenshot-size", size]) == 0
    assert taken == [(1024, 700), SMALLEST_WINDOW]
    for size in (f"{SMALLEST_WINDOW[0] - 1}x700", f"1024x{SMALLEST_WINDOW[1] - 1}"):
        assert main.main(["gui", "--screenshot", shot, "--screenshot-size", size]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{size} is smaller than the workbench lays out; use at least {least}" in err[0]
    assert len(taken) == 2


# --- a small screen: 1024 × 700 ---------------------------------------------------------------------------
SMALL_SCREEN = QSize(1024, 700)


def _on_show(widget: QWidget, window: QWidget) -> QRect:
    """The part of ``widget`` its parents leave on show, in ``window``'s coordinates (empty for a widget
    scrolled out of view or in a dock tab that is not in front)."""
    rect = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    parent = widget.parentWidget()
    while parent is not None and parent is not window:
        rect &= QRect(parent.mapTo(window, QPoint(0, 0)), parent.size())
        parent = parent.parentWidget()
    return rect & window.rect()


def _shown_buttons(w: MainWindow) -> dict[QAbstractButton, QRect]:
    # a dock tab bar too narrow for its tabs scrolls them with two arrows that the style lays one pixel over
    # each other, at its own width for them: they are the tab bar's, not buttons the window lays out
    shown = {b: _on_show(b, w) for b in w.findChildren(QAbstractButton)
             if b.isVisible() and b.window() is w and not isinstance(b.parentWidget(), QTabBar)}
    return {b: rect for b, rect in shown.items() if not rect.isEmpty()}


def _check_buttons(w: MainWindow, where: str) -> None:
    """No button on show lies over another or over a widget beside it, and none is squeezed below its size."""
    shown = _shown_buttons(w)
    assert len(shown) >= 8, f"{where}: too few buttons on show to tell ({len(shown)})"
    for (a, ra), (b, rb) in itertools.combinations(shown.items(), 2):
        assert not ra.intersects(rb), f"{where}: the {a.text()!r} and {b.text()!r} buttons overlap: {ra} and {rb}"
    for button in shown:
        name = f"{type(button).__name__} {button.text()!r}"
        least = button.minimumSizeHint()
        assert button.width() >= least.width() and button.height() >= least.height(), \
            f"{where}: {name} is squeezed to {button.size()} (it needs {least})"
        for other in button.parentWidget().findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly):
            if other is not button and other.isVisible() and not other.isWindow():
                assert not other.geometry().intersects(button.geometry()), \
                    f"{where}: {type(other).__name__} {other.geometry()} lies over {name} {button.geometry()}"


@pytest.mark.parametrize("arranged_for", [SMALL_SCREEN, SCREENS[0]], ids=["small-layout", "laptop-layout"])
def test_the_whole_window_fits_a_small_screen(window, arranged_for):
    w = window
    # a wrapped banner and the demo model's two-line notice: lines that wrap to more rows in a narrow window
    w.banners.show_message("test", "A note from the engine that wraps in a narrow window: " * 3, "amber")
    client = _client(SMALL_SCREEN)
    w.apply_default_layout(arranged_for)
    w.resize(client)
    _settle()
    hint = w.minimumSizeHint()
    assert hint.width() <= client.width() and hint.height() <= client.height(), (hint, client)
    assert w.size() == client                                   # the window took the size it was given
    for size in ("client", "smallest"):
        if size == "smallest":
            for _ in range(3):                    # narrower, its lines wrap to more rows: the least height grows
                w.resize(w.minimumSizeHint())
                _settle()
            assert w.width() <= client.width() and w.height() <= client.height(), w.size()
        for name, dock in w.docks.items():       # each tab brought to the front in turn
            dock.raise_()
            _settle()
            where = f"{size} {w.width()}x{w.height()}, {name} in front"
            _check_buttons(w, where)
            assert name in _on_window(w), f"{where}: the {name} dock is not in the window"
            assert _on_window(w)[name].width() >= dock.minimumSizeHint().width()
        send = w.chat_pane.send_button
        assert not _on_show(send, w).isEmpty() and _on_show(send, w).size() == send.size()    # all of it


def test_a_cut_readout_caption_shows_whole_in_its_tooltip(window):
    panel = window.experts
    caption = panel.readouts["prefetch"].caption                # "Staging hits, since load", the longest
    window.resize(_client(SCREENS[1]))
    window.apply_default_layout(SCREENS[1])
    _settle()
    assert caption.shown_text() == caption.text() and caption.toolTip() == ""    # room enough: whole
    window.resize(_client(SCREENS[0]))
    window.apply_default_layout(SCREENS[0])
    dock = window.docks["experts"]
    dock.raise_()
    window.resizeDocks([dock], [dock.minimumSizeHint().width()], Qt.Orientation.Horizontal)
    _settle()
    assert panel.width() < 240 and panel.readout_columns() == 2
    assert caption.shown_text().endswith("…") and caption.toolTip() == caption.text()


def test_the_context_meter_keeps_its_explanation_while_its_line_is_cut(window):
    meter = window.chat_pane.context_meter
    meter.set_usage(31234, 131072)
    window.apply_default_layout(SMALL_SCREEN)
    window.resize(window.minimumSizeHint().width(), _client(SMALL_SCREEN).height())     # the narrowest chat
    _settle()
    label, explanation = meter.label, meter.toolTip()
    assert explanation.startswith("How much of the model's context")
    assert label.shown_text() != label.text()                      # shortened, or cut with "…"
    assert label.toolTip() == f"{label.text()}\n{explanation}"     # the whole line, then what it means
    window.resize(_client(SCREENS[1]))
    window.apply_default_layout(SCREENS[1])
    _settle()
    assert label.shown_text() == label.text() and label.toolTip() == explanation
    meter.set_usage(None, 0)                                        # no model: the tooltip says what to do
    assert label.toolTip() == meter.toolTip() and meter.toolTip().startswith("Load a model")


# --- banners: a load's notes, one each ------------------------------------------------------------------------
NOTES = (
    "The chat template in tokenizer_config.json fails at line 3 for the role 'system': unknown tag 'generation'; "
    "until then chat is refused and plain prompts work",
    "A GPU memory budget (24.0 GiB) means nothing on the CPU, which has no GPU memory to budget; ignored",
    "Prefetch depth 4, expert policy lru: every expert is resident on the device, so these apply only once the "
    "expert pool is made smaller than every expert (--expert-pool-size, or live)",
    "CUDA graphs need a CUDA GPU and mean nothing on the CPU; ignored",
    "Group size 64 applies to int4 experts only; these experts are bf16, so it is ignored",
)


def _least_height_with_notes(w: MainWindow, count: int) -> int:
    for i in range(count):
        w.banners.show_message(f"note{i}", NOTES[i % len(NOTES)], "amber")
    _settle()
    return w.minimumSizeHint().height()


def _whole_in_view(widget: QWidget, area) -> bool:
    spot = QRect(widget.mapTo(area.viewport(), QPoint(0, 0)), widget.size())
    return area.viewport().rect().contains(spot)


def test_any_number_of_banners_leaves_the_chat_its_room_on_a_small_screen(window):
    w = window
    client = _client(SMALL_SCREEN)
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(client)
    three = _least_height_with_notes(w, 3)
    ten = _least_height_with_notes(w, 10)
    assert ten == three <= client.height()            # more banners scroll, the window needs no more room
    for _ in range(3):                               # the smallest window: the chat's buttons all there
        w.resize(w.minimumSizeHint())
        _settle()
    send = w.chat_pane.send_button
    assert _on_show(send, w).size() == send.size()
    area = w.banners
    for i in range(10):                              # each note can be scrolled to, read whole and dismissed
        banner = area.banner(f"note{i}")
        area.ensureWidgetVisible(banner.label, 0, 0)
        _settle()
        assert _whole_in_view(banner.label, area) and _whole_in_view(banner.close_button, area), f"note{i}"
        banner.close_button.click()
        _settle()
        assert area.text(f"note{i}") == ""
    assert not area.isVisible()


def test_a_new_banner_comes_up_in_view_over_the_notes(window):
    w = window
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(_client(SMALL_SCREEN))
    _least_height_with_notes(w, 5)
    area = w.banners
    bar = area.verticalScrollBar()
    assert bar.maximum() > 0                         # five notes scroll here
    bar.setValue(bar.maximum())
    w.banners.show_message("engine", "The engine stopped: a step failed; the model is still loaded.", "red")
    _settle()
    assert _whole_in_view(area.banner("engine"), area)


def test_a_few_banners_show_whole_where_there_is_room(window):
    w = window
    w.resize(_client(SCREENS[0]))
    w.apply_default_layout(SCREENS[0])
    _least_height_with_notes(w, 2)
    assert w.banners.verticalScrollBar().maximum() == 0
    assert all(_whole_in_view(w.banners.banner(f"note{i}"), w.banners) for i in range(2))


# --- plot titles in a narrow dock ---------------------------------------------------------------------------
NARROWEST_DOCK = 220     # a panel dock at its least width is no wider (about 214 px)


def _narrowest_dock(w: MainWindow, name: str) -> QDockWidget:
    """The dock ``name`` in front, at its least width, in the narrowest window of a small screen."""
    dock = w.docks[name]
    w.apply_default_layout(SMALL_SCREEN)
    w.resize(w.minimumSizeHint().width(), _client(SMALL_SCREEN).height())
    dock.raise_()
    w.resizeDocks([dock], [dock.minimumSizeHint().width()], Qt.Orientation.Horizontal)
    _settle()
    assert dock.width() <= NARROWEST_DOCK
    return dock


@pytest.mark.parametrize("name", ["memory", "experts"])
def test_plot_titles_are_shortened_in_the_narrowest_dock_and_whole_where_there_is_room(window, name):
    w = window
    panel, dock = getattr(w, name), w.docks[name]
    w.resize(_client(SCREENS[1]))
    w.apply_default_layout(SCREENS[1])
    dock.raise_()
    _settle()
    for plot in panel.plots:                         # room enough: the whole title, as ever, and no tooltip
        assert plot.titleLabel.shown == plot.titleLabel.title and plot.titleLabel.toolTip() == ""
    _narrowest_dock(w, name)
    view = panel.graphics
    seen = view.mapToScene(view.viewport().rect()).boundingRect().adjusted(-0.5, -0.5, 0.5, 0.5)
    assert seen.contains(view.ci.sceneBoundingRect())          # the plots are no wider than the dock
    shortened = 0
    for plot in panel.plots:
        title = plot.titleLabel
        text = title.mapRectToScene(title.itemRect())
        assert seen.contains(text), f"{title.title!r} is cut: {text} outside {seen}"
        assert title.shown in (title.title, title.short) and not title.shown.endswith("…")   # words, not cut
        assert title.toolTip() == ("" if title.shown == title.title else title.title)       # whole on hover
        shortened += title.shown != title.title
    assert shortened >= 1                            # a long title gave way to its short one
    cut = panel.plots[0].titleLabel.fitting(60)      # narrower than any dock: the short title cut with "…"
    assert cut.endswith("…") and panel.plots[0].titleLabel.short.startswith(cut[:-1])


# --- plot legends in a narrow dock ---------------------------------------------------------------------------
LEGEND_COLUMNS = {"memory": 2, "experts": 1, "traffic": 1}     # as the panels lay their first legend out


def _entries(plot) -> list[tuple[str, str]]:
    return [(label.text, label.toolTip()) for _, label in plot.legend.items]


@pytest.mark.parametrize("name", sorted(LEGEND_COLUMNS))
def test_legends_fit_the_narrowest_dock_and_are_as_given_where_there_is_room(window, name):
    w = window
    panel, dock = getattr(w, name), w.docks[name]
    w.resize(_client(SCREENS[0]))                    # a laptop's screen: the legends as the panels lay them out
    w.apply_default_layout(SCREENS[0])
    dock.raise_()
    _settle()
    first = panel.plots[0].legend
    assert first.columnCount == LEGEND_COLUMNS[name]
    whole = {plot: [text for text, _ in _entries(plot)] for plot in panel.plots if plot.legend is not None}
    for plot in whole:
        assert all(tip == "" for _, tip in _entries(plot))                   # whole names, nothing to hover
    _narrowest_dock(w, name)
    shortened = 0
    for plot, names in whole.items():
        box = plot.getViewBox().sceneBoundingRect().adjusted(-0.5, -0.5, 0.5, 0.5)
        legend = plot.legend.sceneBoundingRect()
        assert box.contains(legend), f"the legend {legend} leaves its plot {box}"
        for (text, tip), name_in_full in zip(_entries(plot), names):
            assert tip == ("" if text == name_in_full else name_in_full)          # a short name: whole on hover
            shortened += text != name_in_full
    assert shortened >= 1                            # a long name gave way to its short one


# --- a layout saved on a large screen, restored on a small one -----------------------------------------------
BIG_AVAILABLE = QRect(0, 0, 1920, 1040)          # a 1920 × 1080 screen less its task bar
SMALL_AVAILABLE = QRect(0, 0, 1024, 660)         # a 1024 × 700 one


def _saved(tmp_path) -> tuple[object, object]:
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    return settings.value("geometry"), settings.value("window_state")


def _stacked(w: MainWindow) -> bool:
    """Whether the panels show as two groups one over the other (the large screen's layout)."""
    shown = _on_window(w)
    return {"performance", "memory"} <= set(shown) and shown["performance"].bottom() < shown["memory"].top()


def _stacked_again_on_the_big_screen(qtbot, tmp_path) -> bool:
    """Whether a window opened on the big screen with the saved settings shows the two stacked panel groups."""
    back = _bare_window(qtbot, tmp_path)
    back.restore_layout(BIG_AVAILABLE)
    back.show()
    _settle()
    stacked = _stacked(back)
    back.close()
    return stacked


def _closed_on_a_big_screen(qtbot, tmp_path) -> tuple[object, object]:
    """What a window closed on a large screen, in that screen's default layout, saved."""
    big = _bare_window(qtbot, tmp_path)
    big.setGeometry(QRect(BIG_AVAILABLE.topLeft(), _client(SCREENS[1])))
    big.apply_default_layout(BIG_AVAILABLE.size())
    big.show()
    _settle()
    assert _stacked(big)
    assert big.minimumSizeHint().height() > _client(SMALL_SCREEN).height()     # too tall for the small screen
    big.close()
    return _saved(tmp_path)


def _opened_on_the_small_screen(qtbot, tmp_path) -> MainWindow:
    small = _bare_window(qtbot, tmp_path)
    small.restore_layout(SMALL_AVAILABLE)
    small.show()
    _settle()
    return small


def test_a_layout_too_tall_for_a_small_screen_gives_way_to_the_default_and_stays_saved(qtbot, tmp_path, themed):
    saved = _closed_on_a_big_screen(qtbot, tmp_path)
    small = _opened_on_the_small_screen(qtbot, tmp_path)
    client = _client(SMALL_SCREEN)
    assert not _stacked(small) and small.docks["memory"] in small.tabifiedDockWidgets(small.docks["performance"])
    hint = small.minimumSizeHint()
    assert hint.width() <= client.width() and hint.height() <= client.height(), hint
    assert small.width() <= client.width() and small.height() <= client.height(), small.size()
    _check_docks(small)
    small.close()
    assert _saved(tmp_path) == saved                 # left for the large screen
    assert _stacked_again_on_the_big_screen(qtbot, tmp_path)


@pytest.mark.parametrize("rearrange, restored", [
    (lambda w: w.docks["knobs"].setFloating(True), lambda w: w.docks["knobs"].isFloating()),
    (lambda w: w.docks["gpu"].close(), lambda w: w.docks["gpu"].isHidden()),
    (lambda w: w.tabifyDockWidget(w.docks["performance"], w.docks["knobs"]),
     lambda w: w.docks["knobs"] in w.tabifiedDockWidgets(w.docks["performance"])),
    (lambda w: w.docks["memory"].raise_(), lambda w: "memory" in _on_window(w) and "performance" not in _on_window(w)),
], ids=["floated", "closed", "moved", "another-tab"])
def test_what_the_user_changes_on_the_small_screen_is_saved_for_it_and_the_big_screen_keeps_its_own(
        qtbot, tmp_path, themed, rearrange, restored):
    saved = _closed_on_a_big_screen(qtbot, tmp_path)
    small = _opened_on_the_small_screen(qtbot, tmp_path)
    assert not restored(small)
    rearrange(small)
    _settle()
    small.close()
    assert _saved(tmp_path) == saved                # the big screen's layout, as it was
    again = _opened_on_the_small_screen(qtbot, tmp_path)
    assert restored(again)                          # the layout the user made here, not the default
    again.close()
    assert _stacked_again_on_the_big_screen(qtbot, tmp_path)
