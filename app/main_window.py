"""The main window: chat on the left, live panels and knobs in movable docks on the right.

Wires the bridge (engine thread) and the GPU poller (monitor thread) to the widgets; every slot here
runs on the GUI thread. Plots redraw from a 10 Hz timer, never per sample.

The window fits a small screen (1024 × 700) as well as a large one (see :mod:`app.window_layout`):
plots, readouts and status lines shrink instead of widening it, and the knobs scroll.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QChildEvent, QEvent, QRect, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QGuiApplication, QIcon
from PySide6.QtWidgets import (QDockWidget, QFileDialog, QFrame, QLabel, QMainWindow, QScrollArea,
                               QSplitter, QTabBar, QTabWidget, QWidget)

from app.about import show_about
from app.banner import BannerArea, BannerColumn
from app.bridge import EngineBridge
from app.chat_controller import ChatController
from app.chat_export import export_chat
from app.chat_menu import ChatMenu, add_action
from app.chat_pane import ChatPane
from app.conversation_list import ConversationList
from app.conversations import ConversationStore
from app.dialogs import ask
from app.gpu_poller import GpuPoller, GpuSample
from app.knob_memory import KnobMemory
from app.knobs import KnobsPanel, knob_name
from app.load_test import LoadTestDialog
from app.local_server import ServerFactory, open_server
from app.messages import BridgeError, KnobResult, KnobState, ModelDescription, PauseState
from app.panels.base import Panel
from app.panels.cards import pipeline_cards
from app.panels.experts import ExpertPanel
from app.panels.gpu import GpuPanel
from app.panels.memory import MemoryPanel
from app.panels.performance import PerformancePanel
from app.panels.traffic import TrafficPanel
from app.paths import conversations_dir, icon_path
from app.recorder import SessionRecorder
from app.server_switch import ServerSwitch
from app.status_line import MESSAGE_MS, GrowingSlot, MessageSlot, speed_line
from app.thermal import AMBER, RED, ThermalGuard, ThermalState, assess, temperature_note
from app.window_layout import (CHAT_MIN_WIDTH, DOCK_TITLES, KNOBS_MIN_WIDTH, LAYOUT_KEYS, LAYOUT_VERSION,
                               SIDEBAR_MIN_WIDTH, DockWidths, access_keyed, arrange_docks, default_window_size,
                               fit_window, fits, tidy_tab_bars)

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
    """The workbench window; owns the bridge, the poller and the local server, and shuts them down on close."""

    model_ready = Signal(object)      # ModelDescription, once the model is loaded
    load_failed = Signal(str)         # the red load banner's line, once it shows (a model may have opened instead)

    def __init__(self, bridge: EngineBridge, poller: GpuPoller, settings: QSettings,
                 store: ConversationStore | None = None, engine_options: dict | None = None,
                 server_factory: ServerFactory = open_server) -> None:
        super().__init__()
        self.setWindowTitle("Strata")
        self.setWindowIcon(QIcon(str(icon_path())))
        self.bridge, self.poller, self.settings = bridge, poller, settings
        self.engine_options = dict(engine_options or {})
        self.model: ModelDescription | None = None
        self.load_error = ""             # why the last load failed, as its banner says ("" when it did not)
        self.thermal = ThermalState("unknown")
        self.guard = ThermalGuard()
        self.recorder = SessionRecorder()
        self.load_test: LoadTestDialog | None = None
        self.last_gpu: GpuSample | None = None
        self.watched_cards: tuple[int, ...] = ()     # the pipeline's GPUs the poller reads besides its own
        self.knob_memory = KnobMemory(settings)
        self._note_keys: list[str] = []
        self._build_central(store or ConversationStore(conversations_dir()))
        # HTTP on the bridge's own loop: a tool's requests run on the engine the panels show
        self.server = ServerSwitch(bridge.engine_loop, settings, self.banners, self, server_factory)
        self._build_docks()
        self._build_menus()
        self._build_status_bar()
        self._connect()
        self._tick = 0
        self.redraw_timer = QTimer(self)
        self.redraw_timer.timeout.connect(self.redraw)
        self.redraw_timer.start(REDRAW_MS)
        self.restore_layout()

    # --- construction --------------------------------------------------------------------------
    def _build_central(self, store: ConversationStore) -> None:
        self.banners = BannerArea()
        split = QSplitter(Qt.Orientation.Horizontal)
        self.sidebar = ConversationList()
        self.chat_pane = ChatPane()
        # explicit minimums: a long line in the pane is cut or wrapped there, it never widens the window
        self.sidebar.setMinimumWidth(SIDEBAR_MIN_WIDTH)
        self.chat_pane.setMinimumWidth(CHAT_MIN_WIDTH)
        split.addWidget(self.sidebar)
        split.addWidget(self.chat_pane)
        split.setStretchFactor(1, 1)
        split.setSizes([200, 600])
        # its least height: the banners' (bounded, they scroll) and the chat pane's
        self.setCentralWidget(BannerColumn(self.banners, split))
        self.chat = ChatController(self.chat_pane, self.sidebar, store, self.bridge, settings=self.settings)
        self.chat_pane.input.setFocus()      # a first keystroke is the start of a message

    def _dock(self, name: str, widget: QWidget) -> QDockWidget:
        dock = QDockWidget(DOCK_TITLES[name], self)
        dock.setObjectName(f"dock_{name}")
        dock.setWidget(widget)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable |
                         QDockWidget.DockWidgetFeature.DockWidgetFloatable |
                         QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
        return dock

    def _build_docks(self) -> None:
        self.performance, self.gpu_panel, self.memory = PerformancePanel(), GpuPanel(), MemoryPanel()
        self.experts, self.traffic = ExpertPanel(), TrafficPanel()
        self.knobs = KnobsPanel()
        self.panels: list[Panel] = [self.performance, self.gpu_panel, self.memory, self.experts, self.traffic]
        self.knobs_scroll = QScrollArea()
        self.knobs_scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)     # Tab goes from knob to knob, not to the frame
        self.knobs_scroll.setWidget(self.knobs)
        self.knobs_scroll.setWidgetResizable(True)
        self.knobs_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.knobs_scroll.setMinimumWidth(KNOBS_MIN_WIDTH)
        self.setTabPosition(Qt.DockWidgetArea.RightDockWidgetArea, QTabWidget.TabPosition.North)
        widgets = {"performance": self.performance, "gpu": self.gpu_panel, "memory": self.memory,
                   "experts": self.experts, "traffic": self.traffic, "knobs": self.knobs_scroll}
        self.docks = {name: self._dock(name, widget) for name, widget in widgets.items()}
        for panel, dock in zip(self.panels, self.docks.values()):
            # brought in front of its tab group: what came in meanwhile at once, not at its next redraw tick
            dock.visibilityChanged.connect(lambda shown, p=panel: shown and QTimer.singleShot(0, p, p.redraw))
        self.layout_slot = "main"     # where the layout is saved on closing (LAYOUT_KEYS)
        self.dock_widths = DockWidths(self, [d for n, d in self.docks.items() if n != "knobs"], self.docks["knobs"])

    def childEvent(self, event: QChildEvent) -> None:
        """The tab bars Qt makes for docked panels show their titles whole ("Memory", not "M…"), with
        arrows to scroll where the dock is too narrow for them all."""
        super().childEvent(event)
        bar = event.child()
        if event.type() == QEvent.Type.ChildPolished and isinstance(bar, QTabBar):
            bar.setElideMode(Qt.TextElideMode.ElideNone)
            bar.setUsesScrollButtons(True)
            bar.setExpanding(False)

    def apply_default_layout(self, available: QSize) -> None:
        """The docks as a first window on a screen of ``available`` size has them."""
        arrange_docks(self, self.docks, available)
        tidy_tab_bars(self, self.docks)
        self.dock_widths.arranged()

    def reset_layout(self) -> None:
        """View › Reset window layout: the docks as a first window of this window's size has them (not the
        screen's: the two plot groups of a large screen would squeeze a small window's plots)."""
        self.apply_default_layout(self.size())

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        add_action(file, "&Open model folder…", self.open_model_dialog, "Ctrl+O")
        add_action(file, "Export &chat (Markdown or JSON)…", self.export_chat_dialog, "Ctrl+Shift+E")
        add_action(file, "&Export session stats (CSV)…", self.export_session_dialog, "Ctrl+E")
        plots = file.addMenu("Export &plot as PNG")
        for panel, text in zip(self.panels, access_keyed([p.title for p in self.panels])):
            add_action(plots, text, lambda _=False, p=panel: self.export_plot_dialog(p))
        add_action(file, "&Load test…", self.open_load_test, "Ctrl+L")
        file.addSeparator()
        add_action(file, "&Quit", self.close, "Ctrl+Q")
        self.chat_menu = ChatMenu(bar.addMenu("&Chat"), self.chat, self.sidebar.focus_search, self.open_trash)
        view = bar.addMenu("&View")
        docks = list(self.docks.values())
        for dock, text in zip(docks, access_keyed([d.windowTitle() for d in docks], taken="r")):   # r: Reset
            dock.toggleViewAction().setText(text)
            view.addAction(dock.toggleViewAction())
        view.addSeparator()
        add_action(view, "&Reset window layout", self.reset_layout)
        self.server.add_to(bar.addMenu("&Server"))
        help_menu = bar.addMenu("&Help")
        add_action(help_menu, "&About Strata", self.show_about)

    def _build_status_bar(self) -> None:
        # the model's line, and messages over it (a long model path is cut, never widens the window)
        self.status_model = MessageSlot("No model")
        self.status_speed = GrowingSlot()
        self.paused_by_guard = False
        self.status_gpu = QLabel("GPU: polling…")
        self.status_gpu.setMaximumWidth(360)
        bar = self.statusBar()
        bar.addWidget(self.status_model, 1)
        bar.addPermanentWidget(self.server.status)
        bar.addPermanentWidget(self.status_speed)
        bar.addPermanentWidget(self.status_gpu)

    def show_message(self, text: str, ms: int = MESSAGE_MS) -> None:
        """A message in the status bar for ``ms`` (over the model's line)."""
        self.status_model.show_message(text, ms)

    def _set_speed(self, text: str) -> None:
        self.status_speed.set_line(text, reset=text in ("", "idle") or self.paused_by_guard)

    def _connect(self) -> None:
        b = self.bridge
        b.model_loading.connect(self._on_loading)
        b.model_loaded.connect(self._on_model)
        b.knobs_changed.connect(self.knobs.apply_state)
        b.knobs_changed.connect(self._on_knobs)
        b.knob_result.connect(self.knobs.show_result)
        b.knob_result.connect(self._on_knob_result)
        b.context.connect(self.chat.on_context)
        self.chat.store_error.connect(lambda msg: self.banners.show_message("store", msg, "red"))
        self.chat.prefs_error.connect(lambda msg: self.banners.show_message("settings", msg, "red"))
        b.text.connect(self.chat.on_text)
        b.reply_finished.connect(self.chat.on_finished)
        b.reply_finished.connect(self._on_reply_finished)
        b.stats.connect(self.on_stats)
        b.error.connect(self.on_error)
        b.paused_changed.connect(self._on_paused)
        self.poller.sampled.connect(self.on_gpu_sample)
        self.poller.cards_sampled.connect(self.gpu_panel.push_cards)
        # a lambda, not the bound method: the bridge lives in its own thread and takes commands by queue,
        # whereas a connection to its method would be queued to a thread that runs no event loop
        self.knobs.change_requested.connect(lambda option, value: self.bridge.reconfigure(option, value))
        # through a lambda: called on this thread (the bridge's own thread runs the engine loop, not Qt's)
        self.knobs.changes_requested.connect(lambda changes: self.bridge.reconfigure_all(changes))
        self.knobs.guard_changed.connect(self._on_guard_settings)
        self._restore_guard()

    # --- engine events -------------------------------------------------------------------------
    def _on_loading(self, path: str, keeps_running: bool) -> None:
        name = Path(path).name
        self.load_error = ""
        if keeps_running and self.model is not None:
            text = f"Loading {name}… (the current model keeps running)"
            self.banners.show_message("load", f"{text}: {self.model.name} answers until {name} is ready.", "info")
        else:
            text = f"Loading {name}…"
            self.chat_pane.model_line.setText(f"Loading <b>{name}</b>…")
            self._no_model()
            self.banners.clear("load")
        self._set_status_model(text)

    def _on_model(self, m: ModelDescription) -> None:
        self.model = m
        self.load_error = ""
        self.banners.clear("engine")
        self.banners.clear("load")
        self.banners.clear("knobs")
        self.settings.setValue("last_model", m.path)
        self._show_notes(m.notes)
        self.knobs.clear_status()            # they spoke of the previous model
        self.knob_memory.expect_restore(m.path)
        self._show_model_line(m)
        self.chat.set_model(m)
        self.model_ready.emit(m)

    def _show_model_line(self, m: ModelDescription) -> None:
        params = f"{m.params / 1e6:.1f} M" if m.params < 1e9 else f"{m.params / 1e9:.1f} B"
        line = (f"<b>{m.name}</b> &nbsp;·&nbsp; {m.family} &nbsp;·&nbsp; {params} parameters &nbsp;·&nbsp; "
                f"{m.num_layers} layers, {m.num_experts} experts (top-{m.top_k}) &nbsp;·&nbsp; on <b>{m.device}</b>")
        self.chat_pane.model_line.setText(line)
        self.chat_pane.notice.set_text(demo_notice(m) if m.is_demo else "")
        self._set_status_model(f"{m.name} on {m.device}")

    def _set_status_model(self, text: str) -> None:
        self.status_model.set_line(text)

    def _show_notes(self, notes: tuple[str, ...]) -> None:
        """The load's notes (a setting the engine clamped or ignored), one amber banner each."""
        for key in self._note_keys:
            self.banners.clear(key)
        self._note_keys = [f"note{i}" for i in range(len(notes))]
        # a banner reads as a sentence: a capital first; the newest banner goes on top, so the last note first
        for key, note in reversed(list(zip(self._note_keys, notes))):
            self.banners.show_message(key, note[:1].upper() + note[1:], "amber")

    # --- knob values across restarts ----------------------------------------------------------
    def _on_knobs(self, state: KnobState) -> None:
        """After a load, the knob values saved for this model go through the engine one by one."""
        self.knobs.request_all(self.knob_memory.to_restore(state))

    def _on_knob_result(self, result: KnobResult) -> None:
        refused = self.knob_memory.on_result(result, self.knobs.state)
        if refused:
            name = knob_name(result.option) or result.option
            self.banners.show_message("knobs", f"The saved {name} setting ({result.value}) was not applied: "
                                      f"{result.message}. It is back to its value at load.", "amber")

    def on_stats(self, s) -> None:
        """One EngineStats snapshot (~10 Hz): into the rings and the recorder; plots redraw on the timer."""
        now = time.perf_counter()
        for panel in (self.performance, self.gpu_panel, self.memory, self.experts, self.traffic):
            panel.push_stats(s, now)
        cards = pipeline_cards(s)
        if cards != self.watched_cards:      # a pipeline loaded (or gone): read each of its cards
            self.watched_cards = cards
            self.poller.watch(cards)
        self.recorder.on_stats(s)
        if self.load_test is not None:
            self.load_test.on_stats(s)
        self._set_speed(speed_line(s, self.paused_by_guard))

    def on_error(self, err: BridgeError) -> None:
        """Engine errors: a red banner; the window lives on (and after a failed load, so does the model)."""
        if err.source != "load":
            self.banners.show_message("engine", err.message, "red")
            return
        self.banners.show_message("load", err.message, "red")
        self.load_error = err.message
        if self.model is not None:
            self._show_model_line(self.model)
        else:
            self._no_model()
            self._set_status_model("No model loaded")
            # the banner above says why; the line only says what state the window is in
            self.chat_pane.model_line.setText("No model loaded: the last load failed (the reason is in the red "
                                              "banner). Open a model folder with File › Open model folder…")
        self.load_failed.emit(err.message)

    def _no_model(self) -> None:
        """No engine runs: nothing to send to, no knob to turn (and no status line of a closed model)."""
        self.model = None
        self._set_speed("generation paused by the thermal guard" if self.paused_by_guard else "")
        self.chat.set_model(None)
        self.chat_pane.notice.set_text("")
        self.knobs.clear_status()
        self.knobs.show_no_model()

    def _on_reply_finished(self, stats) -> None:
        if self.load_test is not None:
            self.load_test.on_finished(stats)

    def _on_paused(self, state: PauseState) -> None:
        self.paused_by_guard = state.paused
        self._set_speed("generation paused by the thermal guard" if state.paused else "")

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
            temp = "no temperature reading" if sample.gpu_temp_c is None else f"{sample.gpu_temp_c:.0f} °C"
            self.status_gpu.setText(f"{sample.name or 'GPU'} · {temp}")
        self.knobs.set_temperature_note(temperature_note(sample))
        decision = self.guard.update(sample)
        if decision is not None:
            (self.bridge.pause if decision.action == "pause" else self.bridge.resume)(decision.message)
            self.chat.notice(decision.message)

    def _restore_guard(self) -> None:
        """The thermal guard as it was left (the knobs are remembered across restarts)."""
        s = self.settings
        try:
            enabled = str(s.value("guard/enabled", "false")).lower() == "true"
            pause_at, resume_below = float(s.value("guard/pause_at", 83)), float(s.value("guard/resume_below", 75))
        except (TypeError, ValueError):
            return                              # settings written by something else: the defaults stay
        self.knobs.set_guard(enabled, pause_at, resume_below)

    def _on_guard_settings(self, enabled: bool, pause_at: float, resume_below: float) -> None:
        for key, value in (("enabled", enabled), ("pause_at", pause_at), ("resume_below", resume_below)):
            self.settings.setValue(f"guard/{key}", value)
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

    def _suffixed(self, path: str, suffix: str) -> str:
        """``path`` with ``suffix`` where the name typed has none (the dialog asked about the name typed, so
        a file the suffix makes it name is asked about here); "" when the user keeps that file."""
        if Path(path).suffix or Path(path).is_dir():
            return path
        path += suffix
        if Path(path).exists() and not self.confirm_replace(path):
            return ""
        return path

    def confirm_replace(self, path: str) -> bool:
        return ask(self, "Replace file", f"{path} exists. Replace it?")

    def export_session_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export session stats", self._export_path("strata-session.csv"),
                                              "CSV (*.csv)")
        path = self._suffixed(path, ".csv") if path else ""
        if path:
            try:
                n = self.recorder.write_csv(path)
            except OSError as exc:
                self._export_failed(path, exc)
                return
            self._exported(path, f"Wrote {n} samples to {path}")

    def export_chat_dialog(self) -> None:
        conv = self.chat.current
        if not conv.messages:                 # a file holding a title alone is nothing anyone wants
            self.show_message("This chat has no messages yet: nothing to export")
            return
        name = "".join(c if c.isalnum() or c in "-_ " else "-" for c in conv.title).strip() or "chat"
        path, kind = QFileDialog.getSaveFileName(self, "Export chat", self._export_path(f"{name}.md"),
                                                 "Markdown (*.md);;JSON (*.json)")
        # the format picked in the dialog, for a name without one
        path = self._suffixed(path, ".json" if "json" in kind.lower() else ".md") if path else ""
        if path:
            try:
                written = export_chat(conv, path)
            except OSError as exc:
                self._export_failed(path, exc)
                return
            self._exported(str(written), f"Saved {written}")

    def _export_path(self, name: str) -> str:
        """``name`` in the folder the last export went to (the home folder at first)."""
        folder = str(self.settings.value("export_dir", "") or "")
        return str(Path(folder if folder and Path(folder).is_dir() else Path.home()) / name)

    def _exported(self, path: str, message: str) -> None:
        self.show_message(message)
        self.banners.clear("export")
        self.settings.setValue("export_dir", str(Path(path).parent))

    def _export_failed(self, path: str, exc: OSError) -> None:
        """In a red banner that stays until the next export, and in short in the status bar (which cuts a
        long line at a narrow width, and fades)."""
        why = exc.strerror or str(exc)
        text = f"Export failed: {path} could not be written ({why}); choose a folder you can write to and a file name"
        self.show_message(f"Export failed: {Path(path).name} could not be written (the red line above "
                          f"says where and why)", 15000)
        self.banners.show_message("export", text, "red")

    def export_plot_dialog(self, panel: Panel) -> None:
        name = panel.title.lower().replace(" ", "-")
        path, _ = QFileDialog.getSaveFileName(self, f"Export {panel.title}", self._export_path(f"strata-{name}.png"),
                                              "PNG (*.png)")
        if path and not path.lower().endswith(".png"):
            path += ".png"                      # the exporter picks its format by the extension; the dialog
            if Path(path).exists() and not self.confirm_replace(path):   # asked about the name typed only
                return
        if path:
            try:
                panel.export_png(path)
            except OSError as exc:
                self._export_failed(path, exc)
                return
            self._exported(path, f"Saved {path}")

    def open_trash(self) -> None:
        """The deleted chats, each to restore (a dialog of its own: the list is read when it opens)."""
        from app.trash_dialog import TrashDialog
        dialog = TrashDialog(self.chat.trashed, self.chat.restore, str(self.chat.store.trash_folder), self,
                             changed=self.sidebar.trash_changed)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.trash_dialog = dialog
        dialog.show()

    def open_load_test(self) -> None:
        if self.load_test is None:
            self.load_test = LoadTestDialog(self.bridge.submit, self.bridge.cancel, self,
                                            prompt_ids=self.bridge.synthetic_prompt_ids, server_url=self.server.url)
            self.server.url_changed.connect(self.load_test.set_server_url)
            self.model_ready.connect(lambda m: self.load_test.set_context(m.context_tokens))
        if self.model is not None:
            self.load_test.set_context(self.model.context_tokens)
        self.load_test.show()
        self.load_test.raise_()

    def show_about(self) -> None:
        model = f"{self.model.name} ({self.model.path})" if self.model else ""
        show_about(self, self.poller.status, model)

    # --- layout memory and shutdown -------------------------------------------------------------
    def restore_layout(self, available: QRect | None = None) -> None:
        """The saved size, place and docks, fitted to ``available`` (the screen, less its panels; default:
        that of the screen the saved place lies on, else the window's); the
        default ones where nothing (or an older window's layout) was saved. Where the saved docks need more
        room than ``available`` has, the layout last used on such a smaller screen (or the default) stands
        in, and the window saves its changes there: the other stays as it was, for its own screen."""
        self.layout_slot = "main"
        placed, state = self._restore("main")
        if available is None:           # the screen the window was left on, not the one it was made on
            screen = QGuiApplication.screenAt(self.frameGeometry().center()) if placed else None
            available = (screen or self.screen()).availableGeometry()
        if not placed:
            self.resize(default_window_size(available.size()))
        if state is None:
            self.apply_default_layout(available.size())
        elif not fits(self.minimumSizeHint(), available.size()):
            self._smaller_screen_layout(available.size())
        tidy_tab_bars(self, self.docks)
        self.fit_to_screen(available)

    def _restore(self, slot: str) -> tuple[bool, object | None]:
        """The saved size and place and the docks of ``slot`` restored: whether the size and place were, and
        the dock state that was (None where none was saved, or an older window's: the docks stay as they
        were)."""
        geometry_key, state_key = LAYOUT_KEYS[slot]
        geometry, state = self.settings.value(geometry_key), self.settings.value(state_key)
        placed = geometry is not None and self.restoreGeometry(geometry)
        self.dock_widths.arranged()
        return placed, (state if state is not None and self.restoreState(state, LAYOUT_VERSION) else None)

    def _smaller_screen_layout(self, available: QSize) -> None:
        """In place of the saved layout, which needs more room than ``available`` (saved on a
        larger screen: two panel groups one over the other), the one saved on a smaller screen, or else the
        default for this screen, where either fits. The window then saves its changes to that one."""
        if self._restore("smaller")[1] is not None and fits(self.minimumSizeHint(), available):
            self.layout_slot = "smaller"
            return
        self.apply_default_layout(available)
        if fits(self.minimumSizeHint(), available):
            self.resize(default_window_size(available))
            self.layout_slot = "smaller"
        else:                   # no layout fits a screen this small: the user's own, fitted as far as it goes
            self._restore("main")

    def fit_to_screen(self, available: QRect) -> None:
        """Keep the window and each floating dock inside ``available``: a layout saved on a larger
        screen must not leave anything out of reach."""
        if not (self.isMaximized() or self.isFullScreen()):
            fit_window(self, available)
        for dock in self.docks.values():
            if dock.isFloating():
                fit_window(dock, available)

    def closeEvent(self, event: QCloseEvent) -> None:
        geometry_key, state_key = LAYOUT_KEYS[self.layout_slot]
        self.settings.setValue(geometry_key, self.saveGeometry())
        self.settings.setValue(state_key, self.saveState(LAYOUT_VERSION))
        self.settings.sync()
        if self.load_test is not None:
            self.load_test.close_streams()
        self.server.close()                  # its port is free and no client waits before the engine goes
        self.chat.close()
        self.redraw_timer.stop()
        self.poller.stop()
        self.bridge.shutdown()
        super().closeEvent(event)

