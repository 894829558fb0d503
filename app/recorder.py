"""Every stats sample of a session, kept in memory and written to CSV on request."""
from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

from app.export_file import write_export

ENGINE_FIELDS = ("decode_tok_s", "aggregate_tok_s", "prefill_tok_s", "ttft_ms", "step_ms", "running", "waiting",
                 "batch_size", "preemptions", "kv_blocks_used", "kv_blocks_total", "generated_tokens",
                 "prompt_tokens", "requests_finished", "host_syncs")
EXPERT_FIELDS = ("hits", "misses", "prefetch_hits", "prefetch_wasted", "h2d_bytes", "direct_bytes", "fills", "misses_predicted",
                 "copy_wait_ms", "cpu_experts", "bus_experts", "cpu_ms", "cold_predicted_ms", "cold_measured_ms",
                 "steps_ms", "pool_slots_used", "pool_slots_total", "pool_bytes")
MEMORY_FIELDS = ("resident_bytes", "expert_pool_bytes", "kv_cache_bytes", "workspace_bytes", "budget_bytes")
GPU_FIELDS = ("gpu_temp_c", "mem_temp_c", "power_w", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz",
              "gpu_util_pct", "vram_used_bytes", "pcie_rx_bytes_s", "pcie_tx_bytes_s")
COLUMNS = ("wall_time", *ENGINE_FIELDS, *(f"expert_{f}" for f in EXPERT_FIELDS),
           *(f"mem_{f}" for f in MEMORY_FIELDS), *(f if f.startswith("gpu_") else f"gpu_{f}" for f in GPU_FIELDS), "gpu_throttle_reasons")


class SessionRecorder:
    """Rows of engine stats joined with the latest GPU reading; one row per stats sample."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self._gpu: Any = None

    def on_gpu(self, sample: Any) -> None:
        self._gpu = sample

    def on_stats(self, s: Any) -> None:
        """Record one EngineStats snapshot (with the last GPU sample, if any)."""
        g = self._gpu if self._gpu is not None and self._gpu.available else None
        reasons = "" if g is None or g.throttle_reasons is None else "|".join(g.throttle_reasons)
        self.rows.append((
            time.time(),
            *(getattr(s, f) for f in ENGINE_FIELDS),
            *(getattr(s.experts, f) for f in EXPERT_FIELDS),
            *(getattr(s.memory, f) for f in MEMORY_FIELDS),
            *((getattr(g, f) if g is not None else None) for f in GPU_FIELDS),
            reasons))

    def write_csv(self, path: str | Path) -> int:
        """Write every row (atomically); returns how many. Empty cells mean "not measured"."""
        def fill(f) -> None:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            for row in self.rows:
                writer.writerow(["" if v is None else v for v in row])
        write_export(Path(path), fill, newline="")
        return len(self.rows)
