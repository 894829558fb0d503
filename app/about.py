"""Help › About: versions of Strata and its libraries, and the GPU and driver in use."""
from __future__ import annotations

import platform
from importlib import metadata

import pyqtgraph
import PySide6
from PySide6.QtCore import qVersion
from PySide6.QtWidgets import QMessageBox, QWidget


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def about_text(gpu_status: str, model_line: str) -> str:
    """The About box's text (rich text)."""
    rows = [("Strata", _version("strata") if _version("strata") != "not installed" else "0.1.0 (source)"),
            ("Model", model_line or "none loaded"),
            ("GPU", gpu_status or "not polled yet"),
            ("Python", platform.python_version()),
            ("Qt / PySide6", f"{qVersion()} / {PySide6.__version__}"),
            ("pyqtgraph", pyqtgraph.__version__),
            ("PyTorch", _version("torch")),
            ("Triton", _version("triton")),
            ("nvidia-ml-py", _version("nvidia-ml-py"))]
    body = "".join(f"<tr><td><b>{k}</b></td><td>&nbsp;{v}</td></tr>" for k, v in rows)
    return ("<h3>Strata workbench</h3><p>Runs Mixture-of-Experts models on one GPU smaller than the model, "
            f"and shows why it is as fast as it is.</p><table>{body}</table>")


def show_about(parent: QWidget, gpu_status: str, model_line: str) -> None:
    QMessageBox.about(parent, "About Strata", about_text(gpu_status, model_line))
