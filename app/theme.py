"""The dark theme: Qt style sheet from resources/styles, matching pyqtgraph colours and a dark palette."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from app.paths import icon_path, style_path

PLOT_BACKGROUND = "#15171a"
PLOT_FOREGROUND = "#9aa3ad"


def apply_theme(app: QApplication) -> None:
    """Fusion style, a dark palette (for what the style sheet does not reach) and the sheet itself."""
    pg.setConfigOptions(background=PLOT_BACKGROUND, foreground=PLOT_FOREGROUND, antialias=False)
    app.setStyle("Fusion")
    pal = QPalette()
    for role, color in ((QPalette.ColorRole.Window, "#1b1d21"), (QPalette.ColorRole.WindowText, "#dde1e6"),
                        (QPalette.ColorRole.Base, "#15171a"), (QPalette.ColorRole.AlternateBase, "#23262b"),
                        (QPalette.ColorRole.Text, "#dde1e6"), (QPalette.ColorRole.Button, "#2c3036"),
                        (QPalette.ColorRole.ButtonText, "#dde1e6"), (QPalette.ColorRole.Highlight, "#34507a"),
                        (QPalette.ColorRole.HighlightedText, "#ffffff"), (QPalette.ColorRole.ToolTipBase, "#2c3036"),
                        (QPalette.ColorRole.ToolTipText, "#dde1e6"), (QPalette.ColorRole.Link, "#4c9aff"),
                        (QPalette.ColorRole.PlaceholderText, "#6e7681")):
        pal.setColor(role, QColor(color))
    app.setPalette(pal)
    app.setStyleSheet(style_sheet())


def style_sheet() -> str:
    """The dark style sheet, its ``@ICONS@`` made the icons folder's path ("" where the sheet is missing)."""
    path = style_path()
    if not path.is_file():
        return ""
    return path.read_text(encoding="utf-8").replace("@ICONS@", icon_path("").as_posix().rstrip("/"))
