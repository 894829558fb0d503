"""How long the workbench's event loop stalls, idle and while a reply streams (offscreen, demo model).

    python benchmarks/gui_stall.py [--model DIR] [--tokens 200] [--repeats 3] [--loads 0,2] [--out FILE]

A timer on the GUI thread ticks every 5 ms and records how late each tick fires (the gap beyond its
period). Each repeat probes the loaded window with no reply for --idle-ticks ticks, then while one greedy
reply of --tokens streams. Each of ``--loads`` is a number of busy-loop processes run alongside its
repeats (0: the machine as it is; 2: both cores of a 2-core machine taken), ended before the next. Prints
the p50/p99/max of each phase and writes them with the machine, the load average and the versions to
--out (default: results/gui_stall_<date>.json).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
from PySide6.QtCore import QEventLoop, QSettings, Qt, QTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBE_MS = 5
IDLE_TICKS = 200
PROMPT = "In the beginning God created"   # the demo model's greedy reply to it runs the full length


class EventLoopProbe:
    """Records, in ms, how much later than its period each tick of a timer on this thread fires."""

    def __init__(self, period_ms: int = PROBE_MS) -> None:
        self.period_ms = period_ms
        self.gaps: list[float] = []
        self._last = 0.0
        self._timer = QTimer()
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.gaps = []
        self._last = time.perf_counter()
        self._timer.start(self.period_ms)

    def stop(self) -> np.ndarray:
        """The gaps since ``start`` (ms beyond the period; the first tick, which may wait on the caller, is left out)."""
        self._timer.stop()
        return np.asarray(self.gaps[1:], dtype=np.float64)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps.append((now - self._last) * 1000.0 - self.period_ms)
        self._last = now


@dataclass(frozen=True)
class StallSummary:
    """The distribution of one phase's gaps, in ms."""

    ticks: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def summarize(gaps: np.ndarray) -> StallSummary:
    return StallSummary(int(gaps.size), round(float(np.percentile(gaps, 50)), 2),
                        round(float(np.percentile(gaps, 99)), 2), round(float(gaps.max()), 2))


def _run_until(done, timeout_ms: int) -> None:
    """Run the event loop until ``done()`` or the timeout (checked every 10 ms)."""
    loop = QEventLoop()
    check = QTimer()
    check.timeout.connect(lambda: loop.quit() if done() else None)
    check.start(10)
    QTimer.singleShot(timeout_ms, loop.quit)
    loop.exec()
    check.stop()


def probe_idle(probe: EventLoopProbe, ticks: int) -> np.ndarray:
    probe.start()
    _run_until(lambda: len(probe.gaps) > ticks, 60_000)
    return probe.stop()


def probe_reply(window, probe: EventLoopProbe, timeout_ms: int = 240_000) -> tuple[np.ndarray, int]:
    """The gaps while one reply streams, and its completion tokens."""
    finished: list = []
    window.chat.reply_done.connect(finished.append)
    window.chat.send(PROMPT)
    probe.start()
    _run_until(lambda: bool(finished), timeout_ms)
    gaps = probe.stop()
    window.chat.reply_done.disconnect(finished.append)
    if not finished:
        raise SystemExit("error: the reply did not finish in time")
    return gaps, finished[0].completion_tokens


def open_window(model: str, tokens: int, folder: Path):
    """An offscreen window on ``model`` with its settings and conversations in ``folder``."""
    os.environ["XDG_DATA_HOME"] = str(folder / "data")
    os.environ["XDG_CONFIG_HOME"] = str(folder / "config")
    from app.bridge import EngineBridge
    from app.conversations import ConversationStore
    from app.gpu_poller import FakeMonitor, GpuPoller, GpuSample
    from app.launch import make_app
    from app.main_window import MainWindow
    from app.messages import GenerationSettings

    app = make_app()
    monitor = FakeMonitor(GpuSample(timestamp=0.0, status="Fake GPU", name="Fake GPU", gpu_temp_c=55.0))
    window = MainWindow(EngineBridge(), GpuPoller(monitor, interval_ms=30),
                        QSettings(str(folder / "strata.ini"), QSettings.Format.IniFormat),
                        ConversationStore(folder / "data" / "conversations"), engine_options={"device": "cpu"})
    window.bridge.start()
    window.poller.start()
    window.resize(1400, 900)
    window.show()
    window.open_model(model)
    _run_until(lambda: window.model is not None and window.knobs.state is not None, 120_000)
    if window.model is None:
        raise SystemExit(f"error: {model} did not load; run `python main.py info --model {model}` to see why")
    window.chat_pane.settings_box.set_settings(GenerationSettings(temperature=0.0, top_k=0, top_p=1.0,
                                                                  max_tokens=tokens))
    return app, window


def busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def measure(window, probe: EventLoopProbe, idle_ticks: int, label: str) -> dict:
    """One idle probe, then one reply's."""
    idle = summarize(probe_idle(probe, idle_ticks))
    gaps, tokens = probe_reply(window, probe)
    reply = summarize(gaps)
    print(f"{label}: idle p50 {idle.p50_ms} p99 {idle.p99_ms} max {idle.max_ms} ms | reply ({tokens} tokens) "
          f"p50 {reply.p50_ms} p99 {reply.p99_ms} max {reply.max_ms} ms", flush=True)
    return {"idle": asdict(idle), "reply": asdict(reply), "tokens": tokens}


def main() -> None:
    from benchmarks.common import ROOT, write_result

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "resources" / "models" / "demo"))
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle-ticks", type=int, default=IDLE_TICKS)
    ap.add_argument("--loads", default="0,2", help="busy-loop processes to run alongside, one count per set of repeats")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import PySide6

    sets = []
    with tempfile.TemporaryDirectory(prefix="strata-gui-stall-") as tmp:
        app, window = open_window(args.model, args.tokens, Path(tmp))
        probe = EventLoopProbe()
        for n in (int(x) for x in args.loads.split(",")):
            before = round(os.getloadavg()[0], 2)
            load = busy_processes(n)
            try:
                runs = [measure(window, probe, args.idle_ticks, f"load {n}, repeat {i}") for i in range(args.repeats)]
            finally:
                for p in load:
                    p.kill()
                    p.wait()
            sets.append({"busy_processes": n, "loadavg_1m_before": before,
                         "loadavg_1m_after": round(os.getloadavg()[0], 2), "runs": runs})
        window.close()
        app.processEvents()
    out = args.out or ROOT / "benchmarks" / "results" / f"gui_stall_{time.strftime('%Y-%m-%d')}.json"
    write_result(out, {"benchmark": "gui_stall",
                       "machine": {"cores": os.cpu_count(), "qt_platform": os.environ["QT_QPA_PLATFORM"],
                                   "pyside6": PySide6.__version__},
                       "config": {"model": Path(args.model).name, "tokens": args.tokens, "probe_ms": PROBE_MS,
                                  "idle_ticks": args.idle_ticks, "repeats": args.repeats},
                       "loads": sets})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
