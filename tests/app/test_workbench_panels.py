"""What the panels make of engine counters."""
from __future__ import annotations

from app.panels.experts import ExpertPanel
from engine.telemetry import EngineStats, ExpertStats


def test_expert_panel_says_where_the_gpu_prefetch_is_paused(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats()), now=1.0)
    assert panel.readouts["gpu_prefetch"].value.text() == "—"           # resident, or no direct-read step yet
    e = ExpertStats(hits=90, misses=10, claim_use=(("1", 0.28, 0), ("8-15", 0.63, 1), ("16", None, 1)),
                    claim_threshold=0.4, predicting=((1, False), (8, True)))
    panel.push_stats(EngineStats(experts=e), now=2.0)
    readout = panel.readouts["gpu_prefetch"].value
    assert readout.text() == "1 tok paused, 8-15 tok on, 16 tok on"
    tip = readout.toolTip().splitlines()
    assert tip[0] == "steps of 1 token: first claims used 28%; paused below 40%, probed now and then"
    assert tip[1] == "steps of 8-15 tokens: first claims used 63%; 1 claim per layer"
    assert tip[2] == "steps of 16 tokens: too few claims yet to tell; 1 claim per layer"
    assert tip[3] == "Replayed steps measured faster: without predictions at 1 token; predicting at 8 tokens"


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


def test_expert_panel_says_where_missing_experts_ran(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats()), now=1.0)
    assert panel.readouts["cold"].value.text() == "—"                    # every expert resident
    first = ExpertStats(cold_mode="auto", cpu_experts=10, bus_experts=30, cpu_ms=20.0, steps_ms=100.0,
                        last_step_experts=(2, 6), cold_predicted_ms=15.0, cold_measured_ms=25.0)
    panel.push_stats(EngineStats(experts=first), now=2.0)
    then = ExpertStats(cold_mode="auto", cpu_experts=14, bus_experts=34, cpu_ms=50.0, steps_ms=200.0,
                       last_step_experts=(4, 4), cold_predicted_ms=30.0, cold_measured_ms=45.0,
                       cpu_shares=((1, 0.375), (8, 0.25)))
    panel.push_stats(EngineStats(experts=then), now=3.0)
    readout = panel.readouts["cold"].value
    assert readout.text() == "CPU 4 · bus 4"
    tip = readout.toolTip()
    assert "Since load: 14 on the CPU, 34 over the bus" in tip
    assert "CPU busy 30% of the step time" in tip                         # 30 ms of the last 100 ms
    assert "predicted 30 ms, they took 45 ms" in tip
    assert "the CPU takes 3/8 at 1 token, 2/8 at 8 tokens of each layer's missing experts" in tip
    assert tip.splitlines()[0] == "Setting: auto: the host CPU takes the share of missing experts that measures fastest"
    # nothing missed the last step, some before: the counts, not "none yet"
    quiet = ExpertStats(cold_mode="auto", cpu_experts=14, bus_experts=186, last_step_experts=(0, 0))
    panel.push_stats(EngineStats(experts=quiet), now=4.0)
    assert readout.text() == "CPU 0 · bus 0"
    # a CPU run has no bus: its copies are within host memory, and the panels say so
    cpu_run = ExpertStats(cold_mode="bus (auto, on a CPU device)", bus_experts=186, last_step_experts=(0, 3))
    panel.push_stats(EngineStats(experts=cpu_run), now=5.0)
    assert readout.text() == "3 per step" and "there is no GPU and no bus" in readout.toolTip()
    assert readout.toolTip().startswith("Last step: 3 missing experts copied")
    from app.panels.traffic import TrafficPanel
    traffic = TrafficPanel()
    traffic.push_stats(EngineStats(experts=cpu_run), now=1.0)
    assert traffic.readouts["h2d"].value.text() == "no bus"


def test_heatmap_cells_sit_on_their_layer_and_expert_numbers(qapp):
    # 6 layers x 16 experts: cell (layer l, expert e) is centred on (e, l), so the axis ticks name cells
    # (0..5 down, 0..15 across), as the bars above centre layer l on l
    panel = ExpertPanel()
    heat = tuple(tuple(range(16)) for _ in range(6))
    panel.push_stats(EngineStats(experts=ExpertStats(policy="lfu", activations=heat,
                                                     per_layer_hit_rate=(0.5,) * 6, hits=5, misses=5)), now=1.0)
    panel._render(1.0)
    rect = panel._image.mapRectToParent(panel._image.boundingRect())
    assert (rect.left(), rect.top(), rect.width(), rect.height()) == (-0.5, -0.5, 16, 6)
    (x0, x1), (y0, y1) = panel.plots[2].getViewBox().viewRange()
    assert (x0, x1, y0, y1) == (-0.5, 15.5, -0.5, 5.5)


# --- hit rates: what they count and since when --------------------------------------------------
def _rates(panel: ExpertPanel) -> dict[str, str]:
    return {key: panel.readouts[key].value.text() for key in ("hit", "recent", "prefetch", "misses")}


def test_hit_readouts_show_nothing_before_the_first_token(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats(pool_slots_used=4, pool_slots_total=8, policy="lfu",
                                                     per_layer_hit_rate=(1.0, 1.0))), now=1.0)
    assert set(_rates(panel).values()) == {"—"}
    assert "no token has been routed" in panel.readouts["hit"].value.toolTip()
    panel._render(1.0)
    assert len(panel._layers) == 0                     # no per-layer bars made of placeholder 100 %s
    lo, hi = panel.plots[1].getViewBox().viewRange()[0]
    assert lo < 0 and hi > 1                           # yet the axis spans both layers


def test_hit_readouts_say_what_they_count_and_since_when(qapp):
    panel = ExpertPanel()
    captions = {key: panel.readouts[key].caption.text() for key in ("hit", "recent", "prefetch", "misses")}
    assert captions == {"hit": "Pool hits, since load", "recent": "Pool hits, last 2 s",
                        "prefetch": "Staging hits, since load", "misses": "Misses, since load"}
    # 100 needed: 70 found in the pool, 20 in staging slots a prefetch filled, 10 missing
    panel.push_stats(EngineStats(experts=ExpertStats(hits=90, misses=10, prefetch_hits=20, policy="lfu")), now=10.0)
    assert _rates(panel) == {"hit": "70.0%", "recent": "70.0%", "prefetch": "20.0%", "misses": "10"}
    assert "70 were in the pool, 20 in a staging slot" in panel.readouts["hit"].value.toolTip()
    # 1 s later, 100 more: all in the pool; the last 2 s then hold all 200
    panel.push_stats(EngineStats(experts=ExpertStats(hits=190, misses=10, prefetch_hits=20, policy="lfu")), now=11.0)
    assert _rates(panel)["recent"] == "85.0%" and _rates(panel)["hit"] == "85.0%"
    # 2.5 s after that, 100 more, half of them missing: the window forgets what is over 2 s old
    panel.push_stats(EngineStats(experts=ExpertStats(hits=240, misses=60, prefetch_hits=20, policy="lfu")), now=13.5)
    assert _rates(panel)["recent"] == "50.0%"          # 50 of the 100 since 11.0
    assert _rates(panel)["hit"] == f"{100 * 220 / 300:.1f}%"
    # nothing routed for a while: the recent rate has nothing to say
    panel.push_stats(EngineStats(experts=ExpertStats(hits=240, misses=60, prefetch_hits=20, policy="lfu")), now=16.0)
    panel.push_stats(EngineStats(experts=ExpertStats(hits=240, misses=60, prefetch_hits=20, policy="lfu")), now=18.5)
    assert _rates(panel)["recent"] == "—" and _rates(panel)["hit"] != "—"


def test_recent_hits_start_again_after_a_new_model(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats(hits=900, misses=100, policy="lfu")), now=1.0)
    panel.push_stats(EngineStats(experts=ExpertStats(hits=3, misses=1, policy="lfu")), now=1.5)   # counts restart
    assert _rates(panel)["recent"] == "75.0%"


def test_resident_experts_say_why_nothing_is_counted(qapp):
    panel = ExpertPanel()
    panel.push_stats(EngineStats(experts=ExpertStats(pool_slots_used=8, pool_slots_total=8)), now=1.0)
    assert _rates(panel)["hit"] == "—"
    assert "Every expert is on the GPU" in panel.readouts["hit"].value.toolTip()


# --- time axes ------------------------------------------------------------------------------------
def test_every_time_plot_counts_seconds_ago(qapp):
    from app.panels.base import SECONDS_AGO, SecondsAgoAxis
    from app.panels.gpu import GpuPanel
    from app.panels.memory import MemoryPanel
    from app.panels.performance import PerformancePanel
    from app.panels.traffic import TrafficPanel
    panels = [PerformancePanel(), GpuPanel(), MemoryPanel(), ExpertPanel(), TrafficPanel()]
    time_plots = [p for panel in panels for p in panel.plots if isinstance(p.getAxis("bottom"), SecondsAgoAxis)]
    assert len(time_plots) == 2 + 4 + 2 + 1 + 2
    for plot in time_plots:
        assert plot.getAxis("bottom").labelText == SECONDS_AGO
    assert time_plots[0].getAxis("bottom").tickStrings([-60.0, -30.0, 0.0], 1.0, 30.0) == ["60", "30", "0"]


# --- memory: the workspace and host-store rows from a real engine -----------------------------------
def _memory_of(**options):
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    from app.paths import default_model_dir
    with LLMEngine(EngineConfig(model=str(default_model_dir()), device="cpu", **options)) as engine:
        return engine.stats(), engine.model_info


def test_memory_rows_of_a_cpu_engine_with_an_offloaded_pool(qapp):
    from app.panels.memory import MemoryPanel, fmt_bytes
    stats, info = _memory_of(expert_pool_size="8M")
    m = stats.memory
    assert m.pinned_host_bytes == info.routed_expert_bytes > 0        # the host store holds every routed expert
    assert m.workspace_bytes == 0 and m.budget_bytes is None          # no budget: nothing set aside
    panel = MemoryPanel()
    panel.push_stats(stats, now=1.0)
    host = panel.readouts["host"]
    assert host.caption.text() == "Host store (unpinned)" and host.value.text() == fmt_bytes(m.pinned_host_bytes)
    assert "0 bytes pinned" in host.value.toolTip()
    assert panel.readouts["workspace"].value.text() == "none (CPU)"
    # staging: one layer's experts and room for decode prefetches, named in the pool's tooltip
    assert 0 < m.staging_bytes < m.expert_pool_bytes
    assert f"{fmt_bytes(m.staging_bytes)} of staging" in panel.readouts["pool"].value.toolTip()
    # the slots as the Expert pool knob sizes them (8M, to one decimal as the knob shows it), the staging
    # beside them, the unit once, and the caption saying which is which; shown whole in the panel's cell
    pool = panel.readouts["pool"]
    slots, staging = fmt_bytes(m.expert_pool_bytes - m.staging_bytes), fmt_bytes(m.staging_bytes)
    assert slots.endswith(" MiB") and "." in slots and staging.endswith(" MiB")
    assert pool.caption.text() == "Expert pool + staging"
    assert pool.value.text() == f"{slots[:-len(' MiB')]} + {staging}"
    panel.resize(360, 600)
    panel.show()
    qapp.processEvents()
    assert pool.value.shown_text() == pool.value.text()


def test_memory_rows_name_an_embedding_table_in_host_memory_and_the_plan_against_the_peak(qapp):
    import dataclasses

    from app.panels.memory import MemoryPanel, fmt_bytes
    stats, _ = _memory_of(expert_pool_size="8M")
    m = dataclasses.replace(stats.memory, host_table_bytes=64 << 20, pinned_host_bytes=stats.memory.pinned_host_bytes
                            + (64 << 20), budget_bytes=8 << 30, workspace_bytes=256 << 20, max_allocated_bytes=1 << 30)
    panel = MemoryPanel()
    panel.push_stats(dataclasses.replace(stats, memory=m, device="cuda:0"), now=1.0)
    assert "64.0 MiB of it is the token embedding table" in panel.readouts["host"].value.toolTip()
    counted = m.resident_bytes + m.expert_pool_bytes + m.kv_cache_bytes + m.workspace_bytes
    assert panel.readouts["peak"].value.text() == "1.00 GiB"
    assert f"the plan counts {fmt_bytes(counted)}" in panel.readouts["peak"].value.toolTip()


def test_memory_rows_of_a_cpu_engine_with_every_expert_resident(qapp):
    from app.panels.memory import MemoryPanel
    stats, _ = _memory_of()
    assert stats.memory.pinned_host_bytes == 0                        # no host store at all
    panel = MemoryPanel()
    panel.push_stats(stats, now=1.0)
    assert panel.readouts["host"].value.text() == "none"


def test_workspace_is_the_plans_reserve_within_a_budget():
    from engine.memory import plan_memory
    from engine.stats import workspace_bytes
    gib = 1 << 30
    plan = plan_memory(resident_bytes=gib, expert_bytes=1 << 20, num_experts=64, kv_bytes_per_token=1024,
                       budget_bytes=8 * gib, workspace_bytes=gib // 2)
    assert workspace_bytes(plan) == gib // 2
    no_budget = plan_memory(resident_bytes=gib, expert_bytes=1 << 20, num_experts=64, kv_bytes_per_token=1024,
                            budget_bytes=None)
    assert workspace_bytes(no_budget) == 0


def test_host_store_on_a_gpu_is_labelled_pinned(qapp):
    from app.panels.memory import MemoryPanel
    from engine.telemetry import MemoryStats
    panel = MemoryPanel()
    panel.push_stats(EngineStats(device="cuda:0", memory=MemoryStats(pinned_host_bytes=3 << 30, budget_bytes=24 << 30,
                                                                      workspace_bytes=1 << 30)), now=1.0)
    assert panel.readouts["host"].caption.text() == "Host store (pinned)"
    assert panel.readouts["host"].value.text() == "3.00 GiB"
    assert panel.readouts["workspace"].value.text() == "1.00 GiB"


def test_a_readout_too_long_for_its_cell_is_cut_with_an_ellipsis_and_keeps_its_text(qapp):
    from app.panels.base import Readout
    readout = Readout("Cold experts")
    readout.resize(90, 40)
    readout.value.resize(80, readout.value.height())
    readout.set("bus, none missed yet and a great deal more")
    shown = readout.value.shown_text()
    assert shown.endswith("…") and len(shown) < len(readout.value.text())
    assert readout.value.text() == "bus, none missed yet and a great deal more"
    assert readout.value.toolTip() == readout.value.text()             # the whole value on hover
    readout.set("bus, none missed yet and a great deal more", "where the missing experts ran")
    assert readout.value.toolTip() == "bus, none missed yet and a great deal more\nwhere the missing experts ran"
    assert readout.minimumSizeHint().width() < 200                      # the text never widens the panel


def test_every_image_the_style_sheet_names_exists():
    # arrows and check marks are drawn by the sheet (styling their frames turns the style's own off)
    import re
    from pathlib import Path

    from app.theme import style_sheet
    sheet = style_sheet()
    assert "@ICONS@" not in sheet
    urls = re.findall(r'url\("([^"]+)"\)', sheet)
    assert {Path(u).name for u in urls} >= {"chevron-up.svg", "chevron-down.svg", "check.svg"}
    missing = [u for u in urls if not Path(u).is_file()]
    assert not missing, missing


def test_the_bus_readout_says_how_many_experts_were_gathered_and_how_many_layers_ran_in_passes(qapp):
    from app.panels.traffic import TrafficPanel
    panel = TrafficPanel()
    panel.push_stats(EngineStats(experts=ExpertStats(gathered=7)), now=1.0)
    tip = panel.readouts["h2d"].value.toolTip()
    assert "7 that several tokens of a step used" in tip and "passes" not in tip
    panel.push_stats(EngineStats(experts=ExpertStats(gathered=7, extra_passes=3)), now=2.0)
    assert "3 extra passes of layers that missed more experts than the staging slots hold" in \
        panel.readouts["h2d"].value.toolTip()


def test_small_bus_rates_read_in_mb_and_no_step_reads_as_a_dash(qapp):
    from app.panels.performance import PerformancePanel
    from app.panels.traffic import TrafficPanel
    perf = PerformancePanel()
    perf.push_stats(EngineStats(), now=1.0)
    assert perf.readouts["step"].value.text() == "—"                     # no step yet, as TTFT
    bus = TrafficPanel()
    bus.push_stats(EngineStats(experts=ExpertStats(h2d_bytes=0)), now=1.0)
    bus.push_stats(EngineStats(experts=ExpertStats(h2d_bytes=60_000_000)), now=2.0)
    assert bus.readouts["h2d"].value.text() == "60 MB/s"


def test_the_batch_reads_zero_once_nothing_runs(qapp):
    from app.panels.traffic import TrafficPanel
    panel = TrafficPanel()
    panel.push_stats(EngineStats(batch_size=4, running=4), now=1.0)
    assert panel.readouts["batch"].value.text() == "4"
    panel.push_stats(EngineStats(batch_size=4, running=0, waiting=0), now=2.0)
    assert panel.readouts["batch"].value.text() == "0"
    assert "the last step had 4 sequences" in panel.readouts["batch"].value.toolTip()
    assert [row[1] for row in panel.sched.view()] == [4, 0]          # the plot drops to 0 as well


def test_delete_waits_for_a_chat_in_the_list(qapp):
    from app.conversation_list import DETAIL, WRITING, ConversationList
    from app.conversations import Conversation
    side = ConversationList()
    side.set_conversations([], None)
    assert not side.delete_button.isEnabled()
    conv = Conversation()
    side.set_conversations([conv], conv.id)
    assert side.delete_button.isEnabled()
    other = Conversation(title="Other")
    side.set_conversations([conv, other], conv.id, writing=conv.id)     # a reply is being written in conv
    side.set_busy(conv.title, here=True)
    assert not side.delete_button.isEnabled() and "Stop" in side.delete_button.toolTip()
    assert not side.busy_note.isHidden() and "Stop ends it now" in side.busy_note.text()   # why Send waits
    assert side.list.item(0).data(DETAIL) == WRITING
    side.set_conversations([conv, other], other.id, writing=conv.id)    # another chat opened meanwhile
    side.set_busy(conv.title, here=False)
    assert side.delete_button.isEnabled() and f"in “{conv.title}”" in side.busy_note.text()
    side.set_conversations([conv, other], other.id)
    side.set_busy(None)
    assert side.busy_note.isHidden() and side.delete_button.isEnabled()
    assert side.list.item(0).data(DETAIL) != WRITING


def test_sizes_below_a_mebibyte_read_in_kibibytes():
    from app.knobs import pool_text
    from app.panels.memory import fmt_bytes
    assert (fmt_bytes(0), fmt_bytes(288 * 1024), fmt_bytes(3 << 20), fmt_bytes(300 << 20), fmt_bytes(3 << 30)) == \
        ("0 MiB", "288 KiB", "3.0 MiB", "300 MiB", "3.00 GiB")
    assert (pool_text(0), pool_text(384 * 1024), pool_text(9 << 20)) == ("0.0 MiB", "384 KiB", "9.0 MiB")


def test_the_budget_is_in_the_memory_legend_only_while_there_is_one(qapp):
    from app.panels.memory import MemoryPanel
    from engine.telemetry import MemoryStats
    panel = MemoryPanel()
    legend = panel.plots[0].legend
    names = lambda: [label.text for _, label in legend.items]   # noqa: E731
    panel.push_stats(EngineStats(memory=MemoryStats(budget_bytes=None)), now=1.0)
    assert "budget" not in names()
    panel.push_stats(EngineStats(memory=MemoryStats(budget_bytes=24 << 30)), now=2.0)      # a GPU model loaded
    assert names().count("budget") == 1
    panel.push_stats(EngineStats(memory=MemoryStats(budget_bytes=24 << 30)), now=3.0)
    assert names().count("budget") == 1


def test_plots_are_made_without_context_menus(qapp):
    # never made, rather than made and taken away: a view box menu deleted later left the binding
    # wrappers of its children, and a later plot's construction could crash in them
    from app.panels.memory import MemoryPanel
    for panel in (ExpertPanel(), MemoryPanel()):
        for plot in panel.plots:
            assert plot.vb.menu is None and not plot.menuEnabled()


def test_a_legend_takes_one_row_in_a_short_plot_and_short_names_in_a_narrow_one(qapp):
    import pyqtgraph as pg

    from app.panels.base import curve, make_plot
    view = pg.GraphicsLayoutWidget()
    plot = make_plot(view, "Hits", "%", 0)
    curve(plot, "green", "pool hits", short="pool")
    curve(plot, "cyan", "pool + staging hits", short="all hits")
    legend = plot.legend
    view.show()

    def shown(width: int, height: int) -> list[tuple[str, str]]:
        view.resize(width, height)
        for _ in range(3):
            qapp.processEvents()
        box = plot.vb.sceneBoundingRect().adjusted(-0.5, -0.5, 0.5, 0.5)
        assert box.contains(legend.sceneBoundingRect()), (width, height)       # inside its plot, whole
        return [(label.text, label.toolTip()) for _, label in legend.items]

    whole = [("pool hits", ""), ("pool + staging hits", "")]
    assert shown(800, 400) == whole and legend.columnCount == 1          # room: as it was given
    assert shown(800, 120) == whole and legend.columnCount == 2          # too short for two rows: one
    # too narrow for the whole names side by side: the short ones, the whole name on hover
    assert shown(230, 120) == [("pool", "pool hits"), ("all hits", "pool + staging hits")]
    assert shown(800, 400) == whole and legend.columnCount == 1          # and back again
    view.close()


def test_the_slowdown_line_is_labelled_with_its_temperature(qapp):
    from app.gpu_poller import GpuSample
    from app.panels.gpu import GpuPanel
    from app.thermal import OK, ThermalState
    panel = GpuPanel()
    sample = GpuSample(timestamp=0.0, status="Fake GPU", name="Fake GPU", gpu_temp_c=62.0, slowdown_temp_c=90.0)
    panel.push_gpu(sample, ThermalState(OK))
    assert panel._slowdown.isVisible() and panel._slowdown.label.toPlainText() == "slowdown 90 °C"   # not "0 °C"
    panel.push_gpu(sample.with_changes(slowdown_temp_c=None), ThermalState(OK))
    assert not panel._slowdown.isVisible()


def test_tab_passes_the_plots_by(qapp):
    from PySide6.QtCore import Qt

    from app.panels.performance import PerformancePanel
    assert PerformancePanel().graphics.focusPolicy() == Qt.FocusPolicy.NoFocus
