"""Start the workbench: ``run_gui`` (what ``python main.py`` calls) and the ``--screenshot`` mode."""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import (QEventLoop, QLockFile, QSettings, QSize, QSocketNotifier, QSysInfo, Qt, QtMsgType,
                            QTimer, qInstallMessageHandler)
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

from app.bridge import EngineBridge
from app.conversations import ConversationStore
from app.gpu_poller import GpuPoller
from app.main_window import MainWindow
from app.paths import SCREENSHOT_FORMATS, data_dir, default_model_dir, icon_path
from app.theme import apply_theme

SCREENSHOT_SIZE = QSize(1600, 1000)
SCREENSHOT_TIMEOUT_MS = 240_000
log = logging.getLogger(__name__)


def make_app(argv: list[str] | None = None) -> QApplication:
    """The QApplication (created once), themed; headless screenshot runs use the offscreen platform."""
    app = QApplication.instance()
    if app is None:
        app = QApplication(argv or [sys.argv[0]])
        app.setApplicationName("Strata")
        app.setOrganizationName("Strata")
        app.setDesktopFileName("strata")
        app.setWindowIcon(QIcon(str(icon_path())))
        apply_theme(app)
    return app


def choose_model(model: str | None, settings: QSettings) -> str:
    """The model to open: the one asked for, else the last one used (if still there), else the demo."""
    if model:
        return model
    last = settings.value("last_model", "")
    if last and Path(str(last)).is_dir():
        return str(last)
    return str(default_model_dir())


def build_window(model: str | None, engine_options: dict, settings: QSettings | None = None,
                 poller: GpuPoller | None = None, store: ConversationStore | None = None) -> MainWindow:
    """A window wired to a fresh engine thread and GPU poller, loading ``model``."""
    settings = settings if settings is not None else QSettings()
    bridge = EngineBridge(fallback=str(default_model_dir()))
    poller = poller if poller is not None else GpuPoller()
    window = MainWindow(bridge, poller, settings, store=store, engine_options=engine_options)
    bridge.start()
    poller.start()
    window.open_model(choose_model(model, settings))
    return window


def _wait_for(signal, timeout_ms: int) -> bool:
    """Run the event loop until ``signal`` fires; False on timeout."""
    loop = QEventLoop()
    fired: list[bool] = []
    record = lambda *_: fired.append(True)   # noqa: E731  (may run on the emitting thread: only records)
    signal.connect(record)
    signal.connect(loop.quit)                 # queued to this thread's loop
    QTimer.singleShot(timeout_ms, loop.quit)
    loop.exec()
    signal.disconnect(record)
    signal.disconnect(loop.quit)
    return bool(fired)


def take_screenshot(window: MainWindow, path: str, prompt: str | None, size: QSize = SCREENSHOT_SIZE) -> int:
    """Wait for the model (and the whole reply to ``prompt``), then save the window as a picture (PNG,
    or JPEG or BMP by the name's ending).

    The window is the default one at ``size`` (docks as a first start lays them out), captured pixel
    for pixel: what the picture shows is what a user sees at that size.
    """
    window.resize(size)
    window.apply_default_layout(size)
    window.show()
    if not _wait_for_load(window, SCREENSHOT_TIMEOUT_MS):
        print(f"strata: the model did not load in {SCREENSHOT_TIMEOUT_MS // 1000} s; the screenshot shows the "
              f"window as it was (saved to {path})", file=sys.stderr)
    if prompt and window.model is not None:
        window.chat.send(prompt)
        if not _wait_for(window.chat.reply_done, SCREENSHOT_TIMEOUT_MS):
            print("strata: the reply did not finish in time; the screenshot shows it unfinished", file=sys.stderr)
    _wait_for(window.bridge.stats, 2000)   # let the plots take one more sample
    _settle(400)
    image = window.grab()
    if image.size() != size * image.devicePixelRatio():
        print(f"strata: the window is {image.width()}x{image.height()}, not {size.width()}x"
              f"{size.height()}; the picture shows it as it is", file=sys.stderr)
    fmt = SCREENSHOT_FORMATS.get(Path(path).suffix.lower(), "PNG")      # (the command line refuses another)
    if not image.save(path, fmt):
        print(f"strata: could not write {path} as {fmt}; check the folder is writable"
              + ("" if fmt == "PNG" else ", or name a .png file"), file=sys.stderr)
        return 1
    if window.load_error:                # a model that failed to open, whatever opened instead: the banner's line
        print(f"strata: {window.load_error}", file=sys.stderr)
    return 0 if window.model is not None and not window.load_error else 1


def _quiet_offscreen(kind: QtMsgType, context, message: str) -> None:
    """Qt's messages, less the offscreen platform's note that windows have no size hints (it has no
    window manager to give them to): nothing a user can act on."""
    if "propagateSizeHints" not in message:
        print(message, file=sys.stderr)


def _screenshot_run(model: str | None, engine_options: dict, path: str, prompt: str | None, size: QSize) -> int:
    """A screenshot in a scratch workspace: settings and conversations in a temporary folder, removed
    afterwards, so the prompt's exchange and the window's state touch none of the user's saved chats
    or settings (the model is the one a plain start would open)."""
    model = choose_model(model, QSettings())
    with tempfile.TemporaryDirectory(prefix="strata-screenshot-", ignore_cleanup_errors=True) as scratch:
        settings = QSettings(str(Path(scratch) / "settings.ini"), QSettings.Format.IniFormat)
        window = build_window(model, engine_options, settings, store=ConversationStore(Path(scratch) / "chats"))
        try:
            return take_screenshot(window, path, prompt, size)
        finally:
            window.close()
            window.deleteLater()
            _settle(0)                 # the window lets go of the scratch folder's files before it goes


def _wait_for_load(window: MainWindow, timeout_ms: int) -> bool:
    """Run the event loop until the window's model is loaded or its load failed; False on timeout.

    It waits on the window, not on the bridge: the bridge signals from the engine thread, and a load
    refused at once (a bad option) signals before a wait begun later would listen; the window shows
    the outcome from this thread's loop, so what it holds tells a load that already ended.
    """
    ended = lambda: window.model is not None or bool(window.load_error)    # noqa: E731
    if ended():
        return True
    loop = QEventLoop()
    window.model_ready.connect(loop.quit)
    window.load_failed.connect(loop.quit)
    QTimer.singleShot(timeout_ms, loop.quit)
    loop.exec()
    window.model_ready.disconnect(loop.quit)
    window.load_failed.disconnect(loop.quit)
    return ended()


def _settle(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def instance_lock(folder: Path) -> QLockFile | str:
    """The lock one workbench holds on its data folder for as long as it runs, or why it cannot have it:
    two windows on one folder of chats would each write over the other's messages. A lock its process
    left behind when it died is taken over."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return QLockFile("")            # the window reports a folder it cannot use; nothing to share then
    lock = QLockFile(str(folder / "workbench.lock"))
    lock.setStaleLockTime(0)           # stale only when its process is gone, however old
    if lock.tryLock(200):
        return lock
    info = lock.getLockInfo()              # (pid, host, app) in PySide6; a leading ok flag in some bindings
    pid, host = info[-3], info[-2]
    if lock.error() != QLockFile.LockError.LockFailedError or not pid:
        return QLockFile("")            # no lock can be made there (a folder the window reports): run without
    if _gone(pid, host):
        # Its process died, yet Qt could not take the lock over (it writes a file to do so, which a full disk
        # refuses): remove it here (no room needed) and lock again, else run without (the window reports
        # the folder when it cannot save)
        try:
            (folder / "workbench.lock").unlink()
        except OSError:
            return QLockFile("")
        return lock if lock.tryLock(200) else QLockFile("")
    where = f"process {pid}" + (f" on {host}" if host else "")
    return (f"Strata is already open ({where}) with the chats in {folder}; switch to that window, or close it "
            "and start again (two windows would overwrite each other's messages; if no Strata runs, delete "
            f"{folder / 'workbench.lock'})")


def _gone(pid: int, host: str) -> bool:
    """Whether the process ``pid`` of a lock written on ``host`` has ended (only this machine's can be told)."""
    if host and host != QSysInfo.machineHostName():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:                     # alive, another user's
        return False
    return False


def run_gui(model: str | None, engine_options: dict, screenshot: str | None = None, prompt: str | None = None,
            debug: bool = False, screenshot_size: tuple[int, int] | None = None) -> int:
    """Open the workbench on ``model`` (None: the last model, else the bundled demo); returns the exit code.

    With ``screenshot``, the window opens in a scratch workspace, answers ``prompt`` if given, saves
    a PNG there and exits.
    """
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if screenshot and "QT_QPA_PLATFORM" not in os.environ and not os.environ.get("DISPLAY") \
            and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        qInstallMessageHandler(_quiet_offscreen)
    app = make_app()
    if screenshot:
        size = QSize(*screenshot_size) if screenshot_size else SCREENSHOT_SIZE
        return _screenshot_run(model, engine_options, screenshot, prompt, size)
    lock = instance_lock(data_dir())
    if isinstance(lock, str):
        print(f"strata: {lock}", file=sys.stderr)
        if os.environ.get("QT_QPA_PLATFORM") != "offscreen":
            QMessageBox.warning(None, "Strata is already open", lock)
        return 1
    window = build_window(model, engine_options)
    window.show()
    close_on_signals(window)
    if prompt:
        window.model_ready.connect(lambda _m: window.chat.send(prompt), Qt.ConnectionType.SingleShotConnection)
    return app.exec()


def close_on_signals(window: MainWindow) -> None:
    """Ctrl+C in the terminal that started the workbench (SIGINT), or a SIGTERM from the system (a log-out,
    ``kill``), closes the window as its close button does: the layout, drafts and chats are saved and the
    engine is shut down. Qt's loop runs C++ code, where Python cannot run a signal handler: the signal
    writes a byte to a socket that the loop watches, and the handler runs when the loop reads it. A second
    signal while the window closes ends the process at once (a close stuck on a disk or a busy engine);
    a signal the process was started to ignore (``nohup``, a script's background job) stays ignored."""
    reader, writer = socket.socketpair()
    for end in (reader, writer):
        end.setblocking(False)
    try:
        signal.set_wakeup_fd(writer.fileno())
    except ValueError:           # not the main thread (a test's window): the default handlers stay
        reader.close()
        writer.close()
        return
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, window)

    def wake() -> None:
        try:
            reader.recv(64)
        except OSError:
            pass

    def close(signum: int, _frame) -> None:
        log.warning("signal %d: closing the workbench", signum)
        signal.signal(signum, signal.SIG_DFL)     # the next one is not asked twice
        QTimer.singleShot(0, window.close)       # from the loop, after this handler returns

    notifier.activated.connect(wake)
    window._signal_wakeup = (reader, writer, notifier)     # kept as long as the window
    for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, close)
