"""The "Local server" switch: a Server menu, a status-bar readout and the banner of a refused start.

``ServerSwitch`` wires :class:`app.local_server.LocalServer` to the window: the checkable menu action
starts and stops it, "Server port…" chooses the port (remembered in the window's settings; changing it
while serving moves the server), and the status bar shows the URL with a copy button and the HTTP
requests in flight, read once a second. A port that cannot be bound becomes one red banner and the
switch turns back off.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QInputDialog, QLabel, QMenu, QToolButton, QWidget

from app.banner import BannerArea
from app.bridge_api import EngineLoop
from app.local_server import MAX_PORT, MIN_PORT, LocalServer, ServerFactory, ServerPrefs, open_server

IN_FLIGHT_MS = 1000        # the in-flight count is read once a second
BANNER = "server"


class ServerStatus(QWidget):
    """Status-bar readout: "Server http://127.0.0.1:8000/v1 [Copy] · 2 in flight" while on, hidden while off."""

    def __init__(self) -> None:
        super().__init__()
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.url_label = QLabel("")
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy the server's URL (the OpenAI base URL to give a tool)")
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(self.copy_url)
        self.in_flight_label = QLabel("")
        lay.addWidget(self.url_label)
        lay.addWidget(self.copy_button)
        lay.addWidget(self.in_flight_label)
        self.url = ""
        self.hide()

    def show_starting(self, port: int) -> None:
        self.url = ""
        self.url_label.setText(f"Server starting on port {port}…")
        self.copy_button.hide()
        self.in_flight_label.setText("")
        self.show()

    def show_on(self, url: str) -> None:
        self.url = url
        self.url_label.setText(f"Server {url}")
        self.url_label.setToolTip(f"Point a tool's OpenAI base URL at {url}")
        self.copy_button.show()
        self.set_in_flight(0)
        self.show()

    def show_off(self) -> None:
        self.url = ""
        self.hide()

    def show_stopping(self) -> None:
        """Turned off, and waiting for the requests in flight to end (at most the server's grace)."""
        self.url_label.setText("Server stopping (ending the requests in flight)…")
        self.url_label.setToolTip("")
        self.copy_button.hide()

    def set_in_flight(self, n: int) -> None:
        text = f"· {n} in flight"
        if self.in_flight_label.text() != text:      # the bar is re-laid out only on a change
            self.in_flight_label.setText(text)

    def copy_url(self) -> None:
        if self.url:
            QGuiApplication.clipboard().setText(self.url)


class ServerSwitch(QObject):
    """The window's local server: the menu actions, the status readout, the port and the banner."""

    url_changed = Signal(object)     # the API URL while serving, None while not

    def __init__(self, loop: EngineLoop, settings: QSettings, banners: BannerArea, parent: QWidget,
                 factory: ServerFactory = open_server) -> None:
        super().__init__(parent)
        self._window = parent
        self.prefs = ServerPrefs(settings)
        self.banners = banners
        self.server = LocalServer(loop, factory, self)
        self.status = ServerStatus()
        self.action = QAction("&Local server (OpenAI API)", self)
        self.action.setCheckable(True)
        self.action.setToolTip("Serve the loaded model over HTTP at http://127.0.0.1:PORT/v1")
        self.action.toggled.connect(self._on_toggled)
        self.port_action = QAction("Server &port…", self)
        self.port_action.triggered.connect(self.choose_port)
        self._move_to: int | None = None    # a new port chosen while serving: start there once stopped
        self.poll = QTimer(self)
        self.poll.setInterval(IN_FLIGHT_MS)
        self.poll.timeout.connect(lambda: self.status.set_in_flight(self.server.in_flight))
        self.server.started.connect(self._on_started)
        self.server.failed.connect(self._on_failed)
        self.server.stopped.connect(self._on_stopped)
        self._sync_port_text()

    @property
    def url(self) -> str | None:
        return self.server.url

    def add_to(self, menu: QMenu) -> None:
        menu.addAction(self.action)
        menu.addAction(self.port_action)

    def set_on(self, on: bool) -> None:
        """Turn the server on or off (as the menu action does)."""
        self.action.setChecked(on)

    def set_port(self, port: int) -> None:
        """Remember ``port``; a running server moves there."""
        if port == self.prefs.port():
            return
        self.prefs.set_port(port)
        self._sync_port_text()
        if self.server.state in ("on", "starting"):
            self._move_to = port
            self.server.stop()

    def choose_port(self) -> None:
        port, ok = QInputDialog.getInt(self._window, "Local server port",
                                       f"Port for http://127.0.0.1:PORT/v1 ({MIN_PORT}–{MAX_PORT}):",
                                       self.prefs.port(), MIN_PORT, MAX_PORT)
        if ok:
            self.set_port(port)

    def close(self) -> None:
        """Stop the server and wait for its port to be free (before the engine goes)."""
        self.poll.stop()
        self.server.close()
        self.status.show_off()

    # --- slots ------------------------------------------------------------------------------------
    def _on_toggled(self, on: bool) -> None:
        if on:
            self.banners.clear(BANNER)
            port = self.prefs.port()
            self.status.show_starting(port)
            self.action.setEnabled(False)           # until the server answers
            self.server.start(port)
        elif self.server.state == "on":
            self.action.setEnabled(False)
            self.status.show_stopping()
            self.server.stop()

    def _on_started(self, url: str) -> None:
        if self._move_to is not None:          # the port changed while it was binding: move there
            self.server.stop()
            return
        self.action.setEnabled(True)
        self.status.show_on(url)
        self.poll.start()
        self.url_changed.emit(url)

    def _on_failed(self, line: str) -> None:
        self.banners.show_message(BANNER, line, "red")
        self.status.show_off()
        self._set_checked_quietly(False)
        self.action.setEnabled(True)

    def _on_stopped(self) -> None:
        self.poll.stop()
        self.status.show_off()
        self.url_changed.emit(None)
        self.action.setEnabled(True)
        if self._move_to is not None:
            self._move_to = None
            self._on_toggled(True)              # still checked: start again on the new port
        else:
            self._set_checked_quietly(False)

    def _set_checked_quietly(self, on: bool) -> None:
        blocked = self.action.blockSignals(True)
        self.action.setChecked(on)
        self.action.blockSignals(blocked)

    def _sync_port_text(self) -> None:
        self.port_action.setText(f"Server &port… ({self.prefs.port()})")
