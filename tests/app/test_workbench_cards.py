"""A pipeline over several cards: one row per card in the GPU panel, each card read by the GPU poller, and
the launch option that makes the pipeline."""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt

from app.bridge import EngineBridge, open_engine
from app.conversations import ConversationStore
from app.gpu_poller import NO_GPU_STATUS, CardReadings, FakeMonitor, GpuPoller, GpuSample
from app.main_window import MainWindow
from app.panels.base import COLORS
from app.panels.cards import COLUMNS
from app.panels.gpu import GpuPanel
from app.paths import default_model_dir
from engine.telemetry import EngineStats, ExpertStats, MemoryStats, StageStats
from tests.app.conftest import ENGINE_OPTIONS, LOAD_TIMEOUT_MS

GIB = 1 << 30
TIMEOUT = 10_000
CARD0 = GpuSample(timestamp=0.0, status="Fake H200 · driver 570", name="Fake H200", gpu_temp_c=71.0,
                  slowdown_temp_c=90.0, throttle_reasons=("software power cap",))
CARD1 = CARD0.with_changes(gpu_temp_c=64.0, throttle_reasons=())
DEMO = str(default_model_dir())
NO_NVML = GpuSample(timestamp=0.0, available=False, status=NO_GPU_STATUS)


def _stage(rank: int, device: str, layers: tuple[int, int], h2d: int = 0, hits: int = 0, misses: int = 0,
           budget: int | None = 20 * GIB) -> StageStats:
    memory = MemoryStats(resident_bytes=2 * GIB, expert_pool_bytes=10 * GIB, kv_cache_bytes=3 * GIB,
                         workspace_bytes=GIB, budget_bytes=budget)
    experts = ExpertStats(hits=hits, misses=misses, h2d_bytes=h2d, pool_slots_used=40, pool_slots_total=64,
                          policy="lfu")
    return StageStats(rank=rank, device=device, first_layer=layers[0], end_layer=layers[1], experts=experts,
                      memory=memory)


def _two_cards(h2d: tuple[int, int] = (0, 0)) -> EngineStats:
    stages = (_stage(0, "cuda:0", (0, 12), h2d=h2d[0], hits=90, misses=10),
              _stage(1, "cuda:1", (12, 24), h2d=h2d[1], hits=0, misses=0, budget=24 * GIB))
    return EngineStats(device="cuda:0", stages=stages)


def _row(panel: GpuPanel, row: int) -> dict[str, str]:
    table = panel.cards.table
    return {name: table.item(row, c).text() for c, name in enumerate(COLUMNS)}


def test_each_card_of_a_pipeline_has_a_row_with_its_numbers(qapp):
    panel = GpuPanel()
    assert panel.cards.isHidden()
    panel.push_stats(_two_cards(h2d=(1_000_000_000, 0)), now=10.0)
    # half a second later card 0 moved 1.5 GB more over the bus, card 1 nothing
    panel.push_stats(_two_cards(h2d=(2_500_000_000, 0)), now=10.5)
    assert not panel.cards.isHidden() and panel.cards.table.rowCount() == 2
    first, second = _row(panel, 0), _row(panel, 1)
    assert first == {"Layers": "0–11", "Device": "cuda:0", "Memory / budget": "16.0 / 20.0 GiB",
                     "Expert hits": "90.0%", "H2D": "3.00 GB/s", "Temp": "—", "Throttle": "—"}
    # no token routed through card 1's layers yet: no made-up 100 %
    assert second["Layers"] == "12–23" and second["Memory / budget"] == "16.0 / 24.0 GiB"
    assert second["Expert hits"] == "—" and second["H2D"] == "0.00 GB/s"
    memory_tip = panel.cards.table.item(0, COLUMNS.index("Memory / budget")).toolTip()
    assert "resident 2.00 GiB + expert pool 10.00 GiB + KV cache 3.00 GiB + workspace 1.00 GiB" in memory_tip
    assert "80% of its 20.00 GiB budget" in memory_tip

    panel.push_cards(CardReadings(((0, CARD0), (1, CARD1))))
    assert (_row(panel, 0)["Temp"], _row(panel, 0)["Throttle"]) == ("71 °C", "software power cap")
    assert (_row(panel, 1)["Temp"], _row(panel, 1)["Throttle"]) == ("64 °C", "none")
    warm = panel.cards.table.item(0, COLUMNS.index("Throttle")).foreground().color().name()
    assert warm == COLORS["amber"]                       # a power cap is a warning, as on the GPU panel
    assert panel.cards.table.item(1, COLUMNS.index("Throttle")).data(Qt.ItemDataRole.UserRole) is None


def test_one_card_shows_no_per_card_view(qapp):
    panel = GpuPanel()
    panel.push_stats(EngineStats(device="cuda:0"), now=1.0)
    assert panel.cards.isHidden()
    panel.push_stats(_two_cards(), now=2.0)
    assert not panel.cards.isHidden()
    panel.push_stats(EngineStats(device="cuda:0"), now=3.0)     # another model, on one card
    assert panel.cards.isHidden() and panel.cards.table.rowCount() == 0


def test_cards_without_nvml_say_not_available_never_zero(qapp):
    panel = GpuPanel()
    cpu = EngineStats(stages=(_stage(0, "cpu", (0, 3), budget=None), _stage(1, "cpu", (3, 6), budget=None)))
    panel.push_stats(cpu, now=1.0)
    row = _row(panel, 0)
    assert row["Memory / budget"] == "16.0 GiB, no budget"
    assert (row["Temp"], row["Throttle"]) == ("N/A", "N/A")          # a stage on the CPU has no card to read
    panel.push_stats(_two_cards(), now=2.0)
    panel.push_cards(CardReadings(((0, NO_NVML), (1, CARD1.with_changes(gpu_temp_c=None, throttle_reasons=None)))))
    assert (_row(panel, 0)["Temp"], _row(panel, 0)["Throttle"]) == ("N/A", "N/A")
    assert NO_GPU_STATUS in panel.cards.table.item(0, COLUMNS.index("Temp")).toolTip()
    assert (_row(panel, 1)["Temp"], _row(panel, 1)["Throttle"]) == ("N/A", "N/A")   # not reported: not 0 °C


# --- the window and the poller: every card of the pipeline is read ----------------------------------
class _Cards:
    """Opens a fake monitor per card index, and remembers which it opened."""

    def __init__(self, samples: dict[int, GpuSample]) -> None:
        self.samples = samples
        self.opened: dict[int, FakeMonitor] = {}

    def __call__(self, index: int) -> FakeMonitor:
        self.opened[index] = FakeMonitor(self.samples.get(index, NO_NVML))
        return self.opened[index]


def _window(qtbot, tmp_path, cards: _Cards, primary: GpuSample = CARD0) -> MainWindow:
    """A window whose engine never starts: the test feeds its stats, the poller reads fake cards."""
    poller = GpuPoller(FakeMonitor(primary), interval_ms=30, card_monitor=cards)
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    window = MainWindow(EngineBridge(open_engine), poller, settings, ConversationStore(tmp_path / "conversations"))
    qtbot.addWidget(window)
    poller.start()
    return window


def test_the_window_reads_every_card_of_the_pipeline(qtbot, tmp_path, themed):
    cards = _Cards({1: CARD1})
    w = _window(qtbot, tmp_path, cards)
    try:
        w.on_stats(_two_cards())
        qtbot.waitUntil(lambda: _row(w.gpu_panel, 1)["Temp"] == "64 °C", timeout=TIMEOUT)
        assert _row(w.gpu_panel, 0)["Temp"] == "71 °C"      # card 0 is the poller's own monitor
        assert set(cards.opened) == {1}
        w.on_stats(EngineStats(device="cuda:0"))             # back to one card: card 1 is let go
        assert w.gpu_panel.cards.isHidden()
        qtbot.waitUntil(lambda: cards.opened[1].closed, timeout=TIMEOUT)
    finally:
        w.close()


def test_a_card_nvml_cannot_read_says_not_available(qtbot, tmp_path, themed):
    w = _window(qtbot, tmp_path, _Cards({}), primary=NO_NVML)
    try:
        w.on_stats(_two_cards())
        qtbot.waitUntil(lambda: _row(w.gpu_panel, 1)["Temp"] == "N/A", timeout=TIMEOUT)
        assert [_row(w.gpu_panel, r)["Throttle"] for r in (0, 1)] == ["N/A", "N/A"]
    finally:
        w.close()


# --- the launch option -----------------------------------------------------------------------------
def test_pipeline_parallel_from_the_command_line_reaches_the_engine(window_factory, qtbot):
    from engine.cli.options import engine_options
    from strata.cli import _parse
    args = _parse(["--device", "cpu", "--expert-pool-size", ENGINE_OPTIONS["expert_pool_size"],
                   "--pipeline-parallel", "2"])
    options = engine_options(args)
    assert options["pipeline_parallel"] == 2
    w = window_factory(options=options)           # two stages, one process each, on the CPU
    cards = w.gpu_panel.cards
    qtbot.waitUntil(lambda: not cards.isHidden(), timeout=LOAD_TIMEOUT_MS)
    rows = [_row(w.gpu_panel, r) for r in range(cards.table.rowCount())]
    assert len(rows) == 2 and [r["Device"] for r in rows] == ["cpu", "cpu"]
    assert rows[0]["Layers"].startswith("0–") and rows[1]["Layers"].endswith(f"–{w.model.num_layers - 1}")
    assert all(r["Memory / budget"].endswith("no budget") and r["Temp"] == "N/A" for r in rows)


def test_a_pipeline_the_load_refuses_is_one_line_naming_the_fix(qtbot):
    from app.bridge import _load_wording
    message = _load_wording("pipeline_parallel=2 needs 2 GPUs but 1 is visible; lower --pipeline-parallel or "
                            "make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    assert message == ("the pipeline's GPU count 2 needs 2 GPUs but 1 is visible; lower the pipeline's GPU count or make "
                       "more GPUs visible (CUDA_VISIBLE_DEVICES) (start Strata with --pipeline-parallel N)")
    # a real refused load (more stages than the demo has MoE layers): one line in the load's banner
    bridge = EngineBridge(open_engine)
    bridge.start()
    try:
        with qtbot.waitSignal(bridge.error, timeout=LOAD_TIMEOUT_MS) as refused:
            bridge.load_model(DEMO, {"device": "cpu", "pipeline_parallel": 64})
        text = refused.args[0].message
        assert refused.args[0].source == "load" and "\n" not in text and "Traceback" not in text
        assert text.startswith(f"Could not open {DEMO}: the pipeline's GPU count 64 ")
        assert "(start Strata with --pipeline-parallel " in text
    finally:
        bridge.shutdown()


def test_a_note_about_a_start_up_setting_names_it_with_its_unit_and_gives_no_advice():
    # "--expert-pool-size 1000.00 TiB is more than every expert takes" needs nothing done: it used to end
    # "(start Strata with --expert-pool-size 1000.00)", the unit lost and the flag the user gave repeated
    from app.cli_wording import load_wording
    note = load_wording("--expert-pool-size 1000.00 TiB is more than every expert takes (18.00 MiB); the pool "
                        "holds every expert and the rest is left free")
    assert note == ("The expert pool size 1000.00 TiB is more than every expert takes (18.00 MiB); the pool holds "
                    "every expert and the rest is left free")
    advice = load_wording("the pool does not fit; lower --expert-pool-size to 2 GiB")
    assert advice.endswith("(start Strata with --expert-pool-size SIZE)")
