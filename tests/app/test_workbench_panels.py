"""What the panels make of engine counters."""
from __future__ import annotations

from app.panels.experts import ExpertPanel
from engine.telemetry import EngineStats, ExpertStats


def test_expert_panel_says_where_the_gpu_prefetch_is_paused(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats()), now=1.0)
    assert panel.readouts["gpu_prefetch"].value.text() == "—"           # resident, or no direct-read step yet
    e = ExpertStats(hits=90, misses=10, claim_use=(("1", 0.28, 0), ("8-15", 0.63, 1), ("16", None, 1)),
                    claim_threshold=0.4)
    panel.push_stats(EngineStats(experts=e), now=2.0)
    readout = panel.readouts["gpu_prefetch"].value
    assert readout.text() == "1 tok paused, 8-15 tok on, 16 tok on"
    tip = readout.toolTip().splitlines()
    assert tip[0] == "steps of 1 token: first claims used 28%; paused below 40%, probed now and then"
    assert tip[1] == "steps of 8-15 tokens: first claims used 63%; 1 claim per layer"
    assert tip[2] == "steps of 16 tokens: too few claims yet to tell; 1 claim per layer"


def test_expert_panel_names_the_eviction_policy_and_adaptive_memory(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats()), now=1.0)
    assert panel.readouts["policy"].value.text() == "—"                  # every expert resident
    panel.push_stats(EngineStats(experts=ExpertStats(policy="adaptive 0.99")), now=2.0)
    readout = panel.readouts["policy"]
    assert readout.value.text() == "adaptive" and readout.caption.text() == "Eviction (0.99)"
    assert "long (0.99)" in readout.value.toolTip()
    panel.push_stats(EngineStats(experts=ExpertStats(policy="lfu")), now=3.0)
    assert readout.value.text() == "lfu" and readout.caption.text() == "Eviction"
