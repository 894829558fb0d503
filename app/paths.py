"""Where the workbench finds its resources and keeps the user's data."""
from __future__ import annotations

import json
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESOURCES = REPO_ROOT / "resources"
DEMO_MARKER = "STRATA_DEMO.json"
# what a --screenshot writes, by its name's ending (another ending is refused)
SCREENSHOT_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP"}


def default_model_dir() -> Path:
    """The bundled demo model, ``<repo>/resources/models/demo``."""
    return RESOURCES / "models" / "demo"


def icon_path(name: str = "strata.svg") -> Path:
    """An icon file under ``resources/icons``."""
    return RESOURCES / "icons" / name


def style_path(name: str = "dark.qss") -> Path:
    """A Qt style sheet under ``resources/styles``."""
    return RESOURCES / "styles" / name


def data_dir() -> Path:
    """``$XDG_DATA_HOME/strata`` (``~/.local/share/strata`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "strata"


def conversations_dir() -> Path:
    """Where conversations are saved, one JSON file each."""
    return data_dir() / "conversations"


def read_demo_marker(model_dir: str | Path) -> dict | None:
    """The demo marker of a model folder (``{"random_weights": bool, ...}``), or None if it is not a demo."""
    marker = Path(model_dir) / DEMO_MARKER
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"random_weights": True}
    return data if isinstance(data, dict) else {"random_weights": True}
