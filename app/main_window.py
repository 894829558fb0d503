"""The main window: chat on the left, live panels and knobs in movable docks on the right.

Wires the bridge (engine thread) and the GPU poller (monitor thread) to the widgets; every slot here
runs on the GUI thread. Plots redraw from a 10 Hz timer, never per sample.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon
from PySide6.QtWidgets import (QDockWidget, QFileDialog, QLabel, QMainWindow, QMenu, QSplitter, QVBoxLayout,
                               QWidget)

from app.about import show_about
from app.banner import BannerArea
from app.bridge import EngineBridge
from app.chat_controller import ChatController
from app.chat_pane import ChatPane
from app.conversation_list import ConversationList
from app.conversations import ConversationStore
from app.gpu_poller import GpuPoller, GpuSample
from app.knobs import KnobsPanel
from app.load_test import LoadTestDialog
from app.messages import BridgeError, ModelDescription, PauseState
from app.panels.base import Panel
from app.panels.experts import ExpertPanel
from app.panels.gpu import GpuPanel
from app.panels.memory import MemoryPanel
from app.panels.performance import PerformancePanel
from app.panels.traffic import TrafficPanel
from app.paths import conversations_dir, icon_path
from app.recorder import SessionRecorder
from app.thermal import AMBER, RED, ThermalGuard, ThermalState, assess

REDRAW_MS = 33          # a tick every 33 ms redraws one of REDRAW_GROUPS groups: each panel ~10 Hz,
REDRAW_GROUPS = 3       # and no single tick paints every plot at once (keeps each pause of the GUI short)


def demo_notice(model: ModelDescription) -> str:
    """What the window says about the bundled demo model."""
    what = ("Small demo model with random weights: its replies are meaningless text, "
            "useful only to watch the engine and the panels work."
            if model.random_weights else
            "Small demo model trained on a small public-domain corpus: it continues text in that style "
            "and knows little else.")
    return f"{what} Open a real model with File › Open model folder… or start Strata with --model PATH."


class MainWindow(QMainWindow):
    """The workbench window; owns the bridge and the poller and shuts both down on close."""

    model_ready = Signal(object)      # ModelDescription, once the model is loaded

    def __init__(self, bridge: EngineBridge, poller: GpuPoller, settings: QSettings,
                 store: ConversationStore | None = None, engine_options: dict | None = None) -> None:
        super().__init__()
        self.setWindowTitle("Strata")
        self.setWindowIcon(QIcon(str(icon_path())))
        self.bridge, self.poller, self.settings = bridge, poller, settings
        self.engine_options = dict(engine_options or {})
        self.model: ModelDescription | None = None
        self.thermal = ThermalState("unknown")
        self.guard = ThermalGuard()
        self.recorder = SessionRecorder()
        self.load_test: LoadTestDialog | None = None
        self.last_gpu: GpuSample | None = None
        self._build_central(store or ConversationStore(conversations_dir()))
        self._build_docks()
        self._build_menus()
        self._build_status_bar()
        self._connect()
        self._tick = 0
        self.redraw_timer = QTimer(self)
        self.redraw_timer.timeout.connect(self.redraw)
        self.redraw_timer.start(REDRAW_MS)
        self._restore_layout()

    # --- construction --------------------------------------------------------------------------
    def _build_central(self, store: ConversationStore) -> None:
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        self.banners = BannerArea()
        lay.addWidget(self.banners)
        split = QSplitter(Qt.Orientation.Horizontal)
        self.sidebar = ConversationList()
        self.chat_pane = ChatPane()
        split.addWidget(self.sidebar)
        split.addWidget(self.chat_pane)
        split.setStretchFactor(1, 1)
        split.setSizes([200, 600])
        lay.addWidget(split, 1)
        self.setCentralWidget(central)
        self.chat = ChatController(self.chat_pane, self.sidebar, store, self.bridge)

    def _dock(self, name: str, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable |
                         QDockWidget.DockWidgetFeature.DockWidgetFloatable |
                         QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(area, dock)
        return dock

    def _build_docks(self) -> None:
        right = Qt.DockWidgetArea.RightDockWidgetArea
        self.performance, self.gpu_panel, self.memory = PerformancePanel(), GpuPanel(), MemoryPanel()
        self.experts, self.traffic = ExpertPanel(), TrafficPanel()
        self.knobs = KnobsPanel()
        self.panels: list[Panel] = [self.performance, self.gpu_panel, self.memory, self.experts, self.traffic]
        self.docks = {
            "performance": self._dock("dock_performance", PerformancePanel.title, self.performance, right),
            "gpu": self._dock("dock_gpu", GpuPanel.title, self.gpu_panel, right),
            "knobs": self._dock("dock_knobs", KnobsPanel.title, self.knobs, right),
        }
        self.splitDockWidget(self.docks["performance"], self.docks["gpu"], Qt.Orientation.Horizontal)
        self.splitDockWidget(self.docks["gpu"], self.docks["knobs"], Qt.Orientation.Horizontal)
        self.docks["memory"] = self._dock("dock_memory", MemoryPanel.title, self.memory, right)
        self.docks["experts"] = self._dock("dock_experts", ExpertPanel.title, self.experts, right)
        self.docks["traffic"] = self._dock("dock_traffic", TrafficPanel.title, self.traffic, right)
        self.splitDockWidget(self.docks["performance"], self.docks["memory"], Qt.Orientation.Vertical)
        self.splitDockWidget(self.docks["gpu"], self.docks["experts"], Qt.Orientation.Vertical)
        self.tabifyDockWidget(self.docks["experts"], self.docks["traffic"])
        self.docks["experts"].raise_()
        self.resizeDocks([self.docks["performance"], self.docks["gpu"], self.docks["knobs"]], [430, 430, 300],
                         Qt.Orientation.Horizontal)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self._action(file, "&Open model folder…", self.open_model_dialog, "Ctrl+O")
        self._action(file, "&Export session stats (CSV)…", self.export_session_dialog, "Ctrl+E")
        plots = file.addMenu("Export &plot as PNG")
        for panel in self.panels:
            self._action(plots, panel.title, lambda _=False, p=panel: self.export_plot_dialog(p))
        self._action(file, "&Load test…", self.open_load_test, "Ctrl+L")
        file.addSeparator()
        self._action(file, "&Quit", self.close, "Ctrl+Q")
        view = bar.addMenu("&View")
        for dock in self.docks.values():
            view.addAction(dock.toggleViewAction())
        help_menu = bar.addMenu("&Help")
        self._action(help_menu, "&About Strata", self.show_about)

    def _action(self, menu: QMenu, text: str, slot, shortcut: str = "") -> QAction:
        action = menu.addAction(text)
        action.triggered.connect(slot)
        if shortcut:
            action.setShortcut(shortcut)
        return action

    def _build_status_bar(self) -> None:
        self.status_model = QLabel("No model")
        self.status_speed = QLabel("")
        self.status_speed.setMinimumWidth(420)   # a fixed slot: text changes at 10 Hz never re-lay out the bar
        self.status_gpu = QLabel("GPU: polling…")
        bar = self.statusBar()
        bar.addWidget(self.status_model, 1)
        bar.addPermanentWidget(self.status_speed)
        bar.addPermanentWidget(self.status_gpu)

    def _connect(self) -> None:
        b = self.bridge
        b.model_loading.connect(self._on_loading)
        b.model_loaded.connect(self._on_model)
        b.knobs_changed.connect(self.knobs.apply_state)
        b.knob_result.connect(self.knobs.show_result)
        b.text.connect(self.chat.on_text)
        b.reply_finished.connect(self.chat.on_finished)
        b.reply_finished.connect(self._on_reply_finished)
        b.stats.connect(self.on_stats)
        b.error.connect(self.on_error)
        b.paused_changed.connect(self._on_paused)
        self.poller.sampled.connect(self.on_gpu_sample)
        # a lambda, not the bound method: the bridge lives in its own thread and takes commands by queue,
        # whereas a connection to its method would be queued to a thread that runs no event loop
        self.knobs.change_requested.connect(lambda option, value: self.bridge.reconfigure(option, value))
        self.knobs.guard_changed.connect(self._on_guard_settings)

    # --- engine events -------------------------------------------------------------------------
    def _on_loading(self, path: str) -> None:
        self.status_model.setText(f"Loading {path}…")
        self.chat_pane.model_line.setText(f"Loading <b>{Path(path).name}</b>…")
        self.chat.set_model(None)

    def _on_model(self, m: ModelDescription) -> None:
        self.model = m
        self.banners.clear("engine")
        self.settings.setValue("last_model", m.path)
        params = f"{m.params / 1e6:.1f} M" if m.params < 1e9 else f"{m.params / 1e9:.1f} B"
        line = (f"<b>{m.name}</b> &nbsp;·&nbsp; {m.family} &nbsp;·&nbsp; {params} parameters &nbsp;·&nbsp; "
                f"{m.num_layers} layers, {m.num_experts} experts (top-{m.top_k}) &nbsp;·&nbsp; on <b>{m.device}</b>")
        if m.is_demo:
            line += "<br><span style='color:#f0a030'>" + demo_notice(m) + "</span>"
        self.chat_pane.model_line.setText(line)
        self.status_model.setText(f"{m.name} on {m.device}")
        self.chat.set_model(m)
        self.model_ready.emit(m)

    def on_stats(self, s) -> None:
        """One EngineStats snapshot (~10 Hz): into the rings and the recorder; plots redraw on the timer."""
        now = time.perf_counter()
        for panel in (self.performance, self.memory, self.experts, self.traffic):
            panel.push_stats(s, now)
        self.recorder.on_stats(s)
        if self.load_test is not None:
            self.load_test.on_stats(s)
        self.status_speed.setText(f"decode {s.decode_tok_s:.1f} tok/s · aggregate {s.aggregate_tok_s:.1f} tok/s "
                                  f"· {s.running} running, {s.waiting} queued")

    def on_error(self, err: BridgeError) -> None:
        """Engine errors: a red banner; the window lives on."""
        self.banners.show_message("engine", err.message, "red")
        if err.source == "load":
            self.status_model.setText("No model loaded")
            self.chat_pane.model_line.setText(f"<span style='color:#e5484d'>{err.message}</span>")

    def _on_reply_finished(self, stats) -> None:
        if self.load_test is not None:
            self.load_test.on_finished(stats)

    def _on_paused(self, state: PauseState) -> None:
        self.status_speed.setText("generation paused by the thermal guard" if state.paused else "")

    # --- GPU -----------------------------------------------------------------------------------
    def on_gpu_sample(self, sample: GpuSample) -> None:
        """One NVML reading (1 Hz): panels, thermal banner, guard."""
        self.last_gpu = sample
        self.thermal = assess(sample, self.thermal)
        self.gpu_panel.push_gpu(sample, self.thermal)
        self.memory.push_gpu(sample)
        self.traffic.push_gpu(sample)
        self.recorder.on_gpu(sample)
        level = {AMBER: "amber", RED: "red"}.get(self.thermal.level)
        self.banners.show_message("thermal", self.thermal.banner_text() if level else "", level or "info")
        if not sample.available:
            self.status_gpu.setText(sample.status)
        else:
            temp = "temp not supported" if sample.gpu_temp_c is None else f"{sample.gpu_temp_c:.0f} °C"
            self.status_gpu.setText(f"{sample.name or 'GPU'} · {temp}")
        decision = self.guard.update(sample)
        if decision is not None:
            (self.bridge.pause if decision.action == "pause" else self.bridge.resume)(decision.message)
            self.chat.notice(decision.message)

    def _on_guard_settings(self, enabled: bool, pause_at: float, resume_below: float) -> None:
        self.guard.enabled = enabled
        self.guard.set_limits(pause_at, resume_below)
        if self.last_gpu is not None:
            decision = self.guard.update(self.last_gpu)
            if decision is not None:
                (self.bridge.pause if decision.action == "pause" else self.bridge.resume)(decision.message)
                self.chat.notice(decision.message)

    def redraw(self) -> None:
        """Push ring buffers into the visible plots of this tick's group that have new data."""
        now = time.perf_counter()
        self._tick = (self._tick + 1) % REDRAW_GROUPS
        for i, panel in enumerate(self.panels):
            if i % REDRAW_GROUPS == self._tick:
                panel.redraw(now)

    # --- menus ---------------------------------------------------------------------------------
    def open_model(self, path: str) -> None:
        """Load the model folder ``path`` (in the engine thread; errors arrive as a banner)."""
        self.bridge.load_model(path, self.engine_options)

    def open_model_dialog(self) -> None:
        start = str(self.settings.value("last_model", "") or Path.home())
        path = QFileDialog.getExistingDirectory(self, "Open model folder", start)
        if path:
            self.open_model(path)

    def export_session_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export session stats", "strata-session.csv", "CSV (*.csv)")
        if path:
            n = self.recorder.write_csv(path)
            self.statusBar().showMessage(f"Wrote {n} samples to {path}", 5000)

    def export_plot_dialog(self, panel: Panel) -> None:
        name = panel.title.lower().replace(" ", "-")
        path, _ = QFileDialog.getSaveFileName(self, f"Export {panel.title}", f"strata-{name}.png", "PNG (*.png)")
        if path:
            panel.export_png(path)
            self.statusBar().showMessage(f"Saved {path}", 5000)

    def open_load_test(self) -> None:
        if self.load_test is None:
            self.load_test = LoadTestDialog(self.bridge.submit, self.bridge.cancel, self)
        self.load_test.show()
        self.load_test.raise_()

    def show_about(self) -> None:
        model = f"{self.model.name} ({self.model.path})" if self.model else ""
        show_about(self, self.poller.status, model)

    # --- layout memory and shutdown -------------------------------------------------------------
    def _restore_layout(self) -> None:
        geometry = self.settings.value("geometry")
        state = self.settings.value("window_state")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if state is not None:
            self.restoreState(state)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("window_state", self.saveState())
        self.settings.sync()
        self.redraw_timer.stop()
        self.poller.stop()
        self.bridge.shutdown()
        super().closeEvent(event)
