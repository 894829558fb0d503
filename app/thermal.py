"""Thermal and power state from GPU samples, and the optional pause/resume guard.

Pure logic (no Qt): the thermal panel colours itself from :class:`ThermalState`, and the window asks
:class:`ThermalGuard` whether to pause or resume generation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from app.gpu_poller import POWER_REASONS, THERMAL_REASONS, GpuSample

OK, AMBER, RED, UNKNOWN = "ok", "amber", "red", "unknown"
#: How close (°C) memory or core temperature may come to its slowdown threshold before a warning.
NEAR_LIMIT_C = 5.0
_RED_REASONS = frozenset({"hardware thermal slowdown", "hardware slowdown", "hardware power brake"})


@dataclass(frozen=True)
class ThermalState:
    """What the thermal panel and banner show."""

    level: str                      # OK | AMBER | RED | UNKNOWN (no GPU)
    reasons: tuple[str, ...] = ()   # human words, most severe first
    since: float | None = None      # wall-clock time the current warning began

    def banner_text(self) -> str:
        """"GPU throttling: software power cap (since 14:02:11)", or "" when all is well."""
        if self.level not in (AMBER, RED) or not self.reasons:
            return ""
        head = "GPU throttling" if self.level == RED else "GPU warning"
        since = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since else "now"
        return f"{head}: {'; '.join(self.reasons)} (since {since})"


def _near_limit(temp: float | None, limit: float | None, label: str) -> tuple[str, str] | None:
    if temp is None or limit is None:
        return None
    if temp >= limit:
        return RED, f"{label} {temp:.0f} °C at its {limit:.0f} °C slowdown limit"
    if temp >= limit - NEAR_LIMIT_C:
        return AMBER, f"{label} {temp:.0f} °C within {NEAR_LIMIT_C:.0f} °C of its {limit:.0f} °C slowdown limit"
    return None


def _findings(sample: GpuSample) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for reason in sample.throttle_reasons or ():
        if reason in THERMAL_REASONS or reason in POWER_REASONS:
            found.append((RED if reason in _RED_REASONS else AMBER, reason))
    mem_limit = sample.mem_max_temp_c if sample.mem_max_temp_c is not None else sample.slowdown_temp_c
    for hit in (_near_limit(sample.mem_temp_c, mem_limit, "memory"),
                _near_limit(sample.gpu_temp_c, sample.slowdown_temp_c, "GPU")):
        if hit:
            found.append(hit)
    return found


def assess(sample: GpuSample, previous: ThermalState | None = None) -> ThermalState:
    """The state after ``sample``; a warning keeps its start time while it continues."""
    if not sample.available:
        return ThermalState(UNKNOWN)
    found = _findings(sample)
    if not found:
        return ThermalState(OK)
    level = RED if any(lvl == RED for lvl, _ in found) else AMBER
    reasons = tuple(text for lvl, text in sorted(found, key=lambda f: f[0] != RED))
    since = sample.timestamp
    if previous is not None and previous.level in (AMBER, RED) and previous.since is not None:
        since = previous.since
    return ThermalState(level, reasons, since)


@dataclass(frozen=True)
class GuardDecision:
    action: str        # "pause" | "resume"
    message: str       # what the chat says


class ThermalGuard:
    """Pauses generation above ``pause_at_c`` and resumes below ``resume_below_c`` (hysteresis)."""

    def __init__(self, pause_at_c: float = 83.0, resume_below_c: float = 75.0, enabled: bool = False) -> None:
        self.enabled = enabled
        self.paused = False
        self.set_limits(pause_at_c, resume_below_c)

    def set_limits(self, pause_at_c: float, resume_below_c: float) -> None:
        """Change the thresholds; the resume point is kept below the pause point."""
        self.pause_at_c = float(pause_at_c)
        self.resume_below_c = float(min(resume_below_c, pause_at_c - 1.0))

    def update(self, sample: GpuSample) -> GuardDecision | None:
        """Pause or resume if ``sample`` crosses a threshold; None when nothing changes."""
        temp = _hottest(sample)
        if self.paused and (not self.enabled or temp is None or temp < self.resume_below_c):
            self.paused = False
            why = "guard turned off" if not self.enabled else f"{temp:.0f} °C < {self.resume_below_c:.0f} °C" \
                if temp is not None else "no temperature reading"
            return GuardDecision("resume", f"Thermal guard: generation resumed ({why}).")
        if self.enabled and not self.paused and temp is not None and temp >= self.pause_at_c:
            self.paused = True
            return GuardDecision("pause", f"Thermal guard: generation paused at {temp:.0f} °C "
                                          f"(limit {self.pause_at_c:.0f} °C); it resumes below "
                                          f"{self.resume_below_c:.0f} °C.")
        return None


def temperature_note(sample: GpuSample) -> str:
    """Why ``sample`` gives the guard no temperature to act on ("" when it gives one)."""
    if _hottest(sample) is not None:
        return ""
    if not sample.available:
        return f"no GPU temperature is read here ({sample.status})" if sample.status else \
            "no GPU temperature is read here"
    return f"{sample.name or 'this GPU'} reports no temperature"


def _hottest(sample: GpuSample) -> float | None:
    temps = [t for t in (sample.gpu_temp_c, sample.mem_temp_c) if t is not None]
    return max(temps) if temps else None
