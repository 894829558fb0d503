"""Only the panels on screen redraw: a dock behind another's tab counts as visible to Qt (it is moved out of
the window, not hidden), and drawing its plots ten times a second took the engine's thread half its speed on
a small machine. A panel brought to the front draws what came in meanwhile, at once."""
from __future__ import annotations

import pyqtgraph as pg

from tests.app.test_window_layout import _settle


def _points(panel) -> int:
    return sum(len(item.xData) for item in panel.graphics.scene().items()
               if isinstance(item, pg.PlotDataItem) and item.xData is not None)


def _redraw_every_group(w) -> None:
    for _ in range(3):
        w.redraw()


def test_a_panel_behind_another_tab_waits_and_draws_once_in_front(window, qtbot):
    w = window
    w.apply_default_layout(w.size())                        # the panels in one tab group, Throughput in front
    w.docks["performance"].raise_()
    _settle()
    w.redraw_timer.stop()                                  # this test draws by hand
    gpu, performance = w.gpu_panel, w.performance
    assert gpu.isVisible() and not gpu.on_screen()       # Qt calls a panel behind a tab visible
    qtbot.waitUntil(lambda: gpu.dirty and performance.dirty, timeout=10_000)   # stats and GPU samples came
    _redraw_every_group(w)
    assert not performance.dirty and _points(performance) > 0
    assert gpu.dirty and _points(gpu) == 0                 # nothing drawn behind the tab
    w.docks["gpu"].raise_()                               # in front: drawn at once, not at its next tick
    _settle()
    assert _points(gpu) > 0                                # (new samples keep coming: it may be dirty again)
