"""Workbench test fixtures: offscreen Qt, isolated settings and data folders, a window on the demo model."""
from __future__ import annotations

import gc
import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"

import pytest  # noqa: E402
from PySide6.QtCore import QCoreApplication, QEvent, QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.bridge import EngineBridge, open_engine  # noqa: E402
from app.conversations import ConversationStore  # noqa: E402
from app.gpu_poller import FakeMonitor, GpuPoller, GpuSample  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.paths import default_model_dir  # noqa: E402
from app.theme import apply_theme  # noqa: E402

#: The engine options the tests run with: CPU, and a small expert pool so every pool knob is live.
ENGINE_OPTIONS = {"device": "cpu", "expert_pool_size": "8M"}
LOAD_TIMEOUT_MS = 60_000
REPLY_TIMEOUT_MS = 120_000


@pytest.fixture(autouse=True)
def isolated_user_dirs(tmp_path, monkeypatch):
    """Conversations and QSettings go to tmp_path, never to the user's real folders."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "settings"))
    yield


def release_qt_objects() -> None:
    """Delete now, on this (the GUI) thread, what the test left to Qt and Python to delete some time later.

    pytest-qt closes a test's widgets with deleteLater(), and its processEvents() never runs those deletions:
    they waited for the next event loop that some later test happened to spin, and a window kept alive by
    the lambdas its signals are connected to lived on until then. Python-owned Qt objects in reference
    cycles (a chat controller and its timers) waited for the cyclic collector, which runs on whichever thread
    allocates at that moment: an engine or store thread, the xdist channel's or pytest-timeout's thread.
    """
    for w in QApplication.topLevelWidgets():        # never delete a window under its engine or GPU thread
        if isinstance(w, MainWindow) and not w.isVisible():
            for thread in (w.bridge._thread, w.poller._thread):
                assert thread.wait(LOAD_TIMEOUT_MS), f"{thread.objectName()} still running after the window closed"
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)
    gc.collect()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)


@pytest.fixture(autouse=True)
def qt_objects_released():
    """Each test's Qt objects are deleted at its end, on the GUI thread (see release_qt_objects)."""
    yield
    if QCoreApplication.instance() is not None:
        release_qt_objects()


@pytest.fixture(scope="session")
def themed(qapp):
    apply_theme(qapp)
    return qapp


def make_window(qtbot, tmp_path, monitor: FakeMonitor | None = None, options: dict | None = None,
                model: str | None = None) -> MainWindow:
    """A window on a real engine thread (demo model unless ``model``) with a fake GPU polled every 30 ms."""
    settings = QSettings(str(tmp_path / "strata.ini"), QSettings.Format.IniFormat)
    monitor = monitor or FakeMonitor(GpuSample(timestamp=0.0, status="Fake GPU · driver test", name="Fake GPU",
                                               gpu_temp_c=55.0, slowdown_temp_c=90.0))
    bridge = EngineBridge(open_engine)
    poller = GpuPoller(monitor, interval_ms=30)
    store = ConversationStore(tmp_path / "data" / "strata" / "conversations")
    window = MainWindow(bridge, poller, settings, store, engine_options=options or ENGINE_OPTIONS)
    qtbot.addWidget(window)
    bridge.start()
    poller.start()
    window.resize(1400, 900)
    window.show()
    with qtbot.waitSignal(window.model_ready, timeout=LOAD_TIMEOUT_MS):
        window.open_model(model or str(default_model_dir()))
    # the knobs' first state is a separate signal from the engine thread: tests read it, so wait for it
    qtbot.waitUntil(lambda: window.knobs.state is not None, timeout=LOAD_TIMEOUT_MS)
    return window


@pytest.fixture
def window_factory(qtbot, tmp_path, themed):
    """Make windows (closed at the end of the test): ``window_factory(monitor=..., options=...)``."""
    made: list[MainWindow] = []

    def make(**kwargs) -> MainWindow:
        w = make_window(qtbot, tmp_path, **kwargs)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
        # close() joins the engine and GPU threads with time limits (10 s, 5 s) that a loaded machine can
        # pass, and then returns all the same: the window must not be deleted under a thread still running
        for thread in (w.bridge._thread, w.poller._thread):
            assert thread.wait(LOAD_TIMEOUT_MS), f"{thread.objectName()} still running after the window closed"
        w.deleteLater()
    made.clear()


@pytest.fixture
def window(window_factory):
    return window_factory()
