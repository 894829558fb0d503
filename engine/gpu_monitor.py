"""GPU readings from NVML (package ``nvidia-ml-py``), one frozen sample at a time.

Every reading is a value or ``None`` meaning "this card or driver does not report it" — never 0 in
its place, so a consumer card without a memory-temperature sensor shows "not supported" rather than a
cold 0 °C. No Qt here: the workbench polls a :class:`GpuMonitor` from its own thread.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, TypeVar

NO_GPU_STATUS = "No NVIDIA GPU detected"

#: Clock-event (throttle) reason bits of NVML, with the words a user reads.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "GPU idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
#: Reasons that mean heat or power is limiting the clocks (what the thermal panel warns about).
THERMAL_REASONS = frozenset({"software thermal slowdown", "hardware thermal slowdown", "hardware slowdown"})
POWER_REASONS = frozenset({"software power cap", "hardware power brake"})

_NVML_TEMPERATURE_GPU = 0
_NVML_THRESHOLD_SHUTDOWN = 0
_NVML_THRESHOLD_SLOWDOWN = 1
_NVML_THRESHOLD_MEM_MAX = 2
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_PCIE_TX = 0
_NVML_PCIE_RX = 1
_NVML_FI_DEV_MEMORY_TEMP = 82


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU; ``None`` = not supported by this card or driver."""

    timestamp: float
    available: bool = True               # False: no NVIDIA GPU or no driver (see ``status``)
    status: str = ""                     # "NVIDIA H200 · driver 570.86" or NO_GPU_STATUS
    name: str | None = None
    driver: str | None = None
    gpu_temp_c: float | None = None
    mem_temp_c: float | None = None
    slowdown_temp_c: float | None = None  # GPU core slowdown threshold
    shutdown_temp_c: float | None = None
    mem_max_temp_c: float | None = None   # memory temperature limit
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    pcie_tx_bytes_s: float | None = None  # device -> host
    pcie_rx_bytes_s: float | None = None  # host -> device
    fan_pct: float | None = None
    throttle_reasons: tuple[str, ...] | None = field(default=None)  # active reasons; None = not supported

    def with_changes(self, **changes) -> "GpuSample":
        """A copy with some readings changed (used by tests and the fake monitor)."""
        return replace(self, **changes)


def decode_reasons(mask: int) -> tuple[str, ...]:
    """NVML clock-event bit mask -> names of the active reasons, in bit order."""
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


class GpuMonitor(Protocol):
    """Something that reads one GPU; ``sample()`` is called about once a second off the GUI thread."""

    @property
    def available(self) -> bool:
        """Whether a GPU is being read at all."""

    @property
    def status(self) -> str:
        """One line: the GPU and driver, or why nothing is read (e.g. NO_GPU_STATUS)."""

    def sample(self) -> GpuSample:
        """The current readings."""

    def close(self) -> None:
        """Release the library."""


T = TypeVar("T")


class NvmlMonitor:
    """Reads GPU ``index`` through NVML; without a driver or a GPU it reports NO_GPU_STATUS."""

    def __init__(self, index: int = 0) -> None:
        self._nvml = None
        self._handle = None
        self._status = NO_GPU_STATUS
        self._static: dict = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() <= index:
                pynvml.nvmlShutdown()
                return
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no library, no driver, no device: all mean "no GPU to read"
            self._nvml = None
            return
        self._static = self._read_static()
        self._status = f"{self._static['name'] or 'NVIDIA GPU'} · driver {self._static['driver'] or '?'}"

    @property
    def available(self) -> bool:
        return self._handle is not None

    @property
    def status(self) -> str:
        return self._status

    def _try(self, fn: Callable[[], T]) -> T | None:
        """One NVML call; any NVML error (mostly NOT_SUPPORTED) means the reading is absent."""
        try:
            return fn()
        except Exception:
            return None

    def _read_static(self) -> dict:
        n, h = self._nvml, self._handle
        name = self._try(lambda: n.nvmlDeviceGetName(h))
        driver = self._try(n.nvmlSystemGetDriverVersion)
        return {
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "slowdown_temp_c": self._try(lambda: n.nvmlDeviceGetTemperatureThreshold(h, _NVML_THRESHOLD_SLOWDOWN)),
            "shutdown_temp_c": self._try(lambda: n.nvmlDeviceGetTemperatureThreshold(h, _NVML_THRESHOLD_SHUTDOWN)),
            "mem_max_temp_c": self._try(lambda: n.nvmlDeviceGetTemperatureThreshold(h, _NVML_THRESHOLD_MEM_MAX)),
            "sm_clock_max_mhz": self._try(lambda: n.nvmlDeviceGetMaxClockInfo(h, _NVML_CLOCK_SM)),
        }

    def _memory_temp(self) -> float | None:
        values = self._nvml.nvmlDeviceGetFieldValues(self._handle, [_NVML_FI_DEV_MEMORY_TEMP])
        v = values[0]
        if v.nvmlReturn != 0:
            return None
        kinds = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
        reading = getattr(v.value, kinds.get(int(v.valueType), "uiVal"))
        return float(reading) if reading else None  # 0 is how some drivers say "no sensor"

    def _reasons(self) -> tuple[str, ...]:
        n, h = self._nvml, self._handle
        getter = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        return decode_reasons(int(getter(h)))

    def sample(self) -> GpuSample:
        """Read every supported value now (a few ms of driver calls)."""
        if not self.available:
            return GpuSample(timestamp=time.time(), available=False, status=self._status)
        n, h, t = self._nvml, self._handle, self._try
        power = t(lambda: n.nvmlDeviceGetPowerUsage(h))
        limit = t(lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
        util = t(lambda: n.nvmlDeviceGetUtilizationRates(h))
        mem = t(lambda: n.nvmlDeviceGetMemoryInfo(h))
        tx = t(lambda: n.nvmlDeviceGetPcieThroughput(h, _NVML_PCIE_TX))
        rx = t(lambda: n.nvmlDeviceGetPcieThroughput(h, _NVML_PCIE_RX))
        return GpuSample(
            timestamp=time.time(), available=True, status=self._status,
            name=self._static["name"], driver=self._static["driver"],
            gpu_temp_c=_num(t(lambda: n.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU))),
            mem_temp_c=t(self._memory_temp),
            slowdown_temp_c=_num(self._static["slowdown_temp_c"]),
            shutdown_temp_c=_num(self._static["shutdown_temp_c"]),
            mem_max_temp_c=_num(self._static["mem_max_temp_c"]),
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            sm_clock_mhz=_num(t(lambda: n.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_SM))),
            mem_clock_mhz=_num(t(lambda: n.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_MEM))),
            sm_clock_max_mhz=_num(self._static["sm_clock_max_mhz"]),
            gpu_util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            vram_used_bytes=None if mem is None else int(mem.used),
            vram_total_bytes=None if mem is None else int(mem.total),
            pcie_tx_bytes_s=None if tx is None else tx * 1024.0,  # NVML reports KB/s
            pcie_rx_bytes_s=None if rx is None else rx * 1024.0,
            fan_pct=_num(t(lambda: n.nvmlDeviceGetFanSpeed(h))),
            throttle_reasons=t(self._reasons),
        )

    def close(self) -> None:
        """Shut NVML down; later samples report no GPU."""
        if self._nvml is not None:
            self._try(self._nvml.nvmlShutdown)
        self._nvml = None
        self._handle = None
        self._status = NO_GPU_STATUS


def _num(value) -> float | None:
    return None if value is None else float(value)


class FakeMonitor:
    """A scripted monitor: returns ``current`` (tests and demos change it between polls)."""

    def __init__(self, current: GpuSample | None = None, status: str = "Fake GPU · driver test") -> None:
        self.current = current if current is not None else GpuSample(timestamp=0.0, status=status, name="Fake GPU")
        self._status = status if self.current.available else self.current.status
        self.samples_taken = 0
        self.closed = False

    @property
    def available(self) -> bool:
        return self.current.available

    @property
    def status(self) -> str:
        return self.current.status or self._status

    def sample(self) -> GpuSample:
        """``current`` stamped with the time of this read."""
        self.samples_taken += 1
        return replace(self.current, timestamp=time.time())

    def close(self) -> None:
        self.closed = True
