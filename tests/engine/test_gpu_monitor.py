"""GPU monitor: readings are values or None ("not supported"), never a made-up 0."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from engine.gpu_monitor import (NO_GPU_STATUS, FakeMonitor, GpuSample, NvmlMonitor, decode_reasons)


class _NotSupported(Exception):
    pass


def _fake_pynvml(mem_temp_return: int = 3, count: int = 1) -> types.ModuleType:
    """An NVML stand-in shaped like a consumer card: no memory temperature, no fan reading."""
    m = types.ModuleType("pynvml")

    def unsupported(*_a):
        raise _NotSupported("Not Supported")

    field = SimpleNamespace(nvmlReturn=mem_temp_return, valueType=1, value=SimpleNamespace(uiVal=71))
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: "h0"
    m.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 3090"
    m.nvmlSystemGetDriverVersion = lambda: "550.54"
    m.nvmlDeviceGetTemperatureThreshold = lambda h, kind: {0: 98, 1: 93}.get(kind) if kind != 2 else unsupported()
    m.nvmlDeviceGetMaxClockInfo = lambda h, clk: 2100
    m.nvmlDeviceGetTemperature = lambda h, s: 66
    m.nvmlDeviceGetFieldValues = lambda h, ids: [field]
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 350_000
    m.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=97, memory=55)
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=20 << 30, total=24 << 30)
    m.nvmlDeviceGetPcieThroughput = lambda h, c: 1000
    m.nvmlDeviceGetFanSpeed = unsupported
    m.nvmlDeviceGetClockInfo = lambda h, c: 1800 if c == 1 else 9751
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x20
    return m


def test_no_driver_reports_no_gpu_and_no_readings(monkeypatch):
    broken = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    mon = NvmlMonitor()
    assert not mon.available and mon.status == NO_GPU_STATUS
    s = mon.sample()
    assert s.available is False and s.status == NO_GPU_STATUS
    assert s.gpu_temp_c is None and s.power_w is None and s.throttle_reasons is None


def test_zero_devices_is_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count=0))
    assert NvmlMonitor().status == NO_GPU_STATUS


def test_consumer_card_unsupported_readings_are_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(mem_temp_return=3))
    mon = NvmlMonitor()
    assert mon.available and "RTX 3090" in mon.status and "550.54" in mon.status
    s = mon.sample()
    assert s.gpu_temp_c == 66 and s.slowdown_temp_c == 93 and s.shutdown_temp_c == 98
    assert s.mem_temp_c is None and s.mem_max_temp_c is None and s.fan_pct is None
    assert s.power_w == pytest.approx(312.5) and s.power_limit_w == pytest.approx(350.0)
    assert s.vram_total_bytes == 24 << 30 and s.pcie_rx_bytes_s == pytest.approx(1024_000)
    assert s.sm_clock_mhz == 1800 and s.mem_clock_mhz == 9751
    assert s.throttle_reasons == ("software power cap", "software thermal slowdown")
    mon.close()
    assert not mon.available


def test_memory_temperature_read_when_supported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(mem_temp_return=0))
    assert NvmlMonitor().sample().mem_temp_c == 71


def test_decode_reasons_in_bit_order():
    assert decode_reasons(0) == ()
    assert decode_reasons(0x40 | 0x1) == ("GPU idle", "hardware thermal slowdown")


def test_fake_monitor_returns_current_with_fresh_timestamp():
    mon = FakeMonitor(GpuSample(timestamp=0.0, gpu_temp_c=50.0, status="Fake"))
    a = mon.sample()
    mon.current = mon.current.with_changes(gpu_temp_c=88.0)
    b = mon.sample()
    assert (a.gpu_temp_c, b.gpu_temp_c) == (50.0, 88.0) and b.timestamp > 0
    assert mon.samples_taken == 2
    gone = FakeMonitor(GpuSample(timestamp=0.0, available=False, status=NO_GPU_STATUS))
    assert not gone.available and gone.status == NO_GPU_STATUS
