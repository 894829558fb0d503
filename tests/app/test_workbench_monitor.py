"""A fake NVML provider drives throttle states, unsupported readings and the thermal guard."""
from __future__ import annotations

from app.gpu_poller import NO_GPU_STATUS, FakeMonitor, GpuSample

TIMEOUT = 10_000
COOL = GpuSample(timestamp=0.0, status="Fake RTX 3090 · driver 550", name="Fake RTX 3090", gpu_temp_c=60.0,
                 slowdown_temp_c=90.0, mem_temp_c=None, power_w=250.0, power_limit_w=350.0, sm_clock_mhz=1800.0,
                 mem_clock_mhz=9751.0, gpu_util_pct=90.0, throttle_reasons=())


def _readout(window, key: str) -> str:
    return window.gpu_panel.readouts[key].value.text()


def test_throttle_states_turn_the_panel_amber_then_red(window_factory, qtbot):
    mon = FakeMonitor(COOL)
    w = window_factory(monitor=mon)
    qtbot.waitUntil(lambda: _readout(w, "temp") == "60 / 90 °C", timeout=TIMEOUT)
    assert _readout(w, "memtemp") == "n/a"                 # consumer card: N/A, never 0
    assert _readout(w, "fan") == "n/a"
    assert w.gpu_panel.readouts["fan"].value.toolTip() == "This GPU or its driver does not report this reading"
    assert w.gpu_panel.readouts["sm"].value.toolTip() == ""
    assert _readout(w, "state") == "Normal" and w.banners.text("thermal") == ""

    mon.current = COOL.with_changes(throttle_reasons=("software power cap",))
    qtbot.waitUntil(lambda: w.banners.level("thermal") == "amber", timeout=TIMEOUT)
    text = w.banners.text("thermal")
    assert "software power cap" in text and "since" in text
    assert _readout(w, "state") == "Warning"

    mon.current = COOL.with_changes(gpu_temp_c=91.0, throttle_reasons=("hardware thermal slowdown",))
    qtbot.waitUntil(lambda: w.banners.level("thermal") == "red", timeout=TIMEOUT)
    assert "hardware thermal slowdown" in w.banners.text("thermal")
    assert "GPU 91 °C at its 90 °C slowdown limit" in w.banners.text("thermal")
    assert _readout(w, "state") == "Throttling"
    assert "hardware thermal slowdown" in w.gpu_panel.flags_label.text()

    mon.current = COOL
    qtbot.waitUntil(lambda: w.banners.text("thermal") == "", timeout=TIMEOUT)
    assert _readout(w, "state") == "Normal"


def test_memory_temperature_near_its_limit_warns(window_factory, qtbot):
    mon = FakeMonitor(COOL.with_changes(mem_temp_c=92.0, mem_max_temp_c=95.0))
    w = window_factory(monitor=mon)
    qtbot.waitUntil(lambda: w.banners.level("thermal") == "amber", timeout=TIMEOUT)
    assert "memory 92 °C within 5 °C of its 95 °C slowdown limit" in w.banners.text("thermal")
    assert _readout(w, "memtemp") == "92 °C"


def test_no_gpu_says_so_everywhere(window_factory, qtbot):
    w = window_factory(monitor=FakeMonitor(GpuSample(timestamp=0.0, available=False, status=NO_GPU_STATUS)))
    qtbot.waitUntil(lambda: w.gpu_panel.stack.currentIndex() == 0 and w.last_gpu is not None, timeout=TIMEOUT)
    assert w.gpu_panel.no_gpu.text().startswith(NO_GPU_STATUS)
    assert w.status_gpu.text() == NO_GPU_STATUS
    assert w.traffic.readouts["pcie"].value.text() == "no GPU"
    assert w.banners.text("thermal") == ""


def test_thermal_guard_pauses_and_resumes_generation(window_factory, qtbot):
    mon = FakeMonitor(COOL)
    w = window_factory(monitor=mon)
    w.knobs.guard_pause.setValue(80)
    w.knobs.guard_resume.setValue(70)
    w.knobs.guard_enabled.setChecked(True)
    with qtbot.waitSignal(w.bridge.paused_changed, timeout=TIMEOUT,
                          check_params_cb=lambda s: s.paused) as paused:
        mon.current = COOL.with_changes(gpu_temp_c=84.0)
    assert "paused at 84 °C" in paused.args[0].reason
    qtbot.waitUntil(lambda: any("paused at 84 °C" in b.text for b in w.chat_pane.view.bubbles), timeout=TIMEOUT)
    for _ in range(2):                                  # the engine's stats go on: the status bar still says why
        qtbot.waitSignal(w.bridge.stats, timeout=TIMEOUT).wait()
    assert w.status_speed.text() == "generation paused by the thermal guard"
    mon.current = COOL.with_changes(gpu_temp_c=75.0)     # between the thresholds: stays paused
    seen = mon.samples_taken
    qtbot.waitUntil(lambda: mon.samples_taken > seen + 3, timeout=TIMEOUT)
    assert w.guard.paused
    with qtbot.waitSignal(w.bridge.paused_changed, timeout=TIMEOUT, check_params_cb=lambda s: not s.paused):
        mon.current = COOL.with_changes(gpu_temp_c=65.0)
    qtbot.waitUntil(lambda: any("resumed" in b.text for b in w.chat_pane.view.bubbles), timeout=TIMEOUT)
    qtbot.waitUntil(lambda: w.status_speed.text() == "idle", timeout=TIMEOUT)


def test_the_thermal_guard_is_remembered_and_resumes_below_where_it_pauses(window_factory, qtbot):
    w = window_factory(monitor=FakeMonitor(COOL))
    k = w.knobs
    k.guard_resume.setValue(75)
    k.guard_pause.setValue(50)                         # below the resume point: the guard resumes below 49
    assert k.guard_resume.value() == 75 and w.guard.resume_below_c == 49   # the box keeps what was set
    assert k.guard_line.isVisibleTo(k) and "resumes below 49 °C" in k.guard_line.text()
    k.guard_pause.setValue(90)                         # back above it: the value set holds again
    assert w.guard.resume_below_c == 75 and not k.guard_line.isVisibleTo(k)
    k.guard_pause.setValue(60)
    k.guard_enabled.setChecked(True)
    assert w.guard.enabled and w.guard.resume_below_c == 59
    w.close()
    again = window_factory(monitor=FakeMonitor(COOL))  # the same settings file
    k = again.knobs
    assert (k.guard_enabled.isChecked(), k.guard_pause.value(), k.guard_resume.value()) == (True, 60, 75)
    assert again.guard.enabled and again.guard.resume_below_c == 59


def test_a_guard_with_no_temperature_to_read_says_it_cannot_act(window_factory, qtbot):
    mon = FakeMonitor(COOL.with_changes(gpu_temp_c=None, mem_temp_c=None))
    w = window_factory(monitor=mon)
    k = w.knobs
    seen = mon.samples_taken
    qtbot.waitUntil(lambda: mon.samples_taken > seen + 1, timeout=TIMEOUT)
    assert not k.guard_line.isVisibleTo(k)             # off: nothing to say
    k.guard_enabled.setChecked(True)
    assert k.guard_line.isVisibleTo(k) and "The guard cannot act" in k.guard_line.text()
    assert "reports no temperature" in k.guard_line.text()
    mon.current = COOL.with_changes(gpu_temp_c=50.0)   # a reading arrives: the note goes
    qtbot.waitUntil(lambda: not k.guard_line.isVisibleTo(k), timeout=TIMEOUT)


def test_the_status_bar_says_idle_once_nothing_runs_not_the_speeds_trailing_off():
    from types import SimpleNamespace

    from app.status_line import speed_line
    trailing = SimpleNamespace(decode_tok_s=2.0, aggregate_tok_s=2.0, running=0, waiting=0)
    assert speed_line(trailing) == "idle"
    busy = SimpleNamespace(decode_tok_s=51.25, aggregate_tok_s=98.0, running=2, waiting=1)
    assert speed_line(busy) == "2 running, 1 queued · 51.2 tok/s each · 98.0 tok/s total"
    busy.waiting = 0
    assert speed_line(busy) == "2 running · 51.2 tok/s each · 98.0 tok/s total"
    busy.waiting = 1
    assert speed_line(busy, paused=True) == "generation paused by the thermal guard · 3 waiting"
    assert speed_line(trailing, paused=True) == "generation paused by the thermal guard"
