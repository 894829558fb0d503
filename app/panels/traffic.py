"""Host→device traffic counted by the engine beside NVML's PCIe throughput, and the scheduler's
batch, queue and copy waits."""
from __future__ import annotations

import time
from typing import Any

from app.panels.base import NOT_SUPPORTED, NOT_SUPPORTED_TIP, Panel, Ring, curve, fit_y, make_plot, set_series

GB = 1e9


class TrafficPanel(Panel):
    title = "Transfers and batch"

    def __init__(self) -> None:
        super().__init__([("h2d", "H2D (engine)"), ("pcie", "PCIe RX (NVML)"), ("wait", "Copy wait"),
                          ("batch", "Batch"), ("running", "Running"), ("waiting", "Queued"),
                          ("preempt", "Preemptions"), ("syncs", "Host syncs")])
        self.bus = Ring(3)          # engine H2D GB/s, NVML PCIe RX GB/s, copy wait ms per s
        self.sched = Ring(3)        # batch, running, waiting
        self._prev: tuple[float, int, float] | None = None
        self._pcie_rx: float | None = None
        p1 = make_plot(self.graphics, "Host → device", "GB/s", 0)
        self._h2d = curve(p1, "blue", "engine (copies and direct reads)", short="engine")
        self._pcie = curve(p1, "amber", "PCIe RX (NVML)", dash=True, short="PCIe RX")
        p2 = make_plot(self.graphics, "Batch and queue", "requests", 1)
        self._batch = curve(p2, "green", "batch")
        self._running = curve(p2, "cyan", "running", width=1.0)
        self._waiting = curve(p2, "red", "queued")
        self.plots = (p1, p2)

    def push_stats(self, s: Any, now: float | None = None) -> None:
        """One EngineStats snapshot; rates come from the change since the previous one."""
        now = time.perf_counter() if now is None else now
        e = s.experts
        h2d = wait = None
        if self._prev is not None and now > self._prev[0]:
            dt = now - self._prev[0]
            h2d = max(e.h2d_bytes - self._prev[1], 0) / dt / GB
            wait = max(e.copy_wait_ms - self._prev[2], 0.0) / dt
        self._prev = (now, e.h2d_bytes, e.copy_wait_ms)
        cpu_run = "CPU device" in getattr(e, "cold_mode", "")
        if cpu_run:
            h2d = None               # copies within host memory cross no bus: no curve, as the readout says
        self.bus.append(now, h2d, self._pcie_rx, wait)
        idle = s.running == 0 and s.waiting == 0      # the last step's size is history then, not the batch
        batch = 0 if idle else s.batch_size
        self.sched.append(now, batch, s.running, s.waiting)
        r = self.readouts
        if cpu_run:                                         # a CPU run: host memory only, no bus to count
            r["h2d"].set("no bus", "The model runs on the CPU: experts are copied within host memory, "
                                             "which is not traffic over a bus")
        else:
            r["h2d"].set("—" if h2d is None else f"{h2d:.2f} GB/s" if h2d >= 1 else f"{h2d * 1000:.0f} MB/s",
                         f"{e.h2d_bytes / GB:.2f} GB since load, {e.direct_bytes / GB:.2f} GB of it read directly "
                         f"from host memory by the MoE kernels; {e.fills} of the experts read so were kept and "
                         "admitted into the pool without a second trip over the bus; "
                         f"{e.gathered} that several tokens of a step used were copied in once for all of them"
                         + (f"; {e.extra_passes} extra passes of layers that missed more experts than the staging "
                            "slots hold (each missing expert still crossed once)" if e.extra_passes else ""))
        r["wait"].set("—" if wait is None else f"{wait:.0f} ms/s")
        r["batch"].set(str(batch), f"nothing runs; the last step had {s.batch_size} sequence{'' if s.batch_size == 1 else 's'}" if idle and s.batch_size
                       else "sequences in the last step (decode and prefill chunks together)")
        r["running"].set(str(s.running))
        r["waiting"].set(str(s.waiting))
        r["preempt"].set(str(s.preemptions))
        r["syncs"].set(str(s.host_syncs))
        self.dirty = True

    def push_gpu(self, sample: Any) -> None:
        """NVML's PCIe receive throughput (host → device), when the card reports it."""
        rx = sample.pcie_rx_bytes_s
        self._pcie_rx = None if rx is None else rx / GB
        if not sample.available:
            self.readouts["pcie"].set("no GPU")
        else:
            shown = (NOT_SUPPORTED, NOT_SUPPORTED_TIP) if rx is None else (f"{rx / GB:.2f} GB/s", "")
            self.readouts["pcie"].set(*shown)

    def _render(self, now: float) -> None:
        rows = self.bus.view()
        set_series(self._h2d, rows, 0, now)
        set_series(self._pcie, rows, 1, now)
        fit_y(self.plots[0], rows[:, 1:3])
        rows = self.sched.view()
        set_series(self._batch, rows, 0, now)
        set_series(self._running, rows, 1, now)
        set_series(self._waiting, rows, 2, now)
        fit_y(self.plots[1], rows[:, 1:4])
