"""A layout saved on a bigger screen: resetting the layout on a smaller one (View › Reset window layout)
leaves it saved."""
from __future__ import annotations

from PySide6.QtCore import QSettings

from tests.app.test_window_layout import (_closed_on_a_big_screen, _opened_on_the_small_screen, _saved, _settle,
                                          _stacked_again_on_the_big_screen)


def test_reset_window_layout_keeps_the_big_screens_layout(qtbot, tmp_path, themed):
    saved = _closed_on_a_big_screen(qtbot, tmp_path)
    small = _opened_on_the_small_screen(qtbot, tmp_path)
    small.apply_default_layout(small.screen().availableGeometry().size())     # View › Reset window layout
    _settle()
    assert small.layout_slot == "smaller"
    small.close()
    assert _saved(tmp_path) == saved
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    assert settings.value("smaller_screen/window_state") is not None      # the reset layout, for this screen
    assert _stacked_again_on_the_big_screen(qtbot, tmp_path)
