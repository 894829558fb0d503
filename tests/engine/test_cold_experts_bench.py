"""benchmarks/cold_experts.py on a tiny shape: each setting timed with and without the gather of shared
missing experts, in one process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gather_on_and_off_are_both_timed_and_only_on_gathers(tmp_path):
    out = tmp_path / "cold.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cold_experts.py"), "--smoke", "--formats", "bf16",
                          "--depths", "2", "--batches", "4", "--modes", "bus", "--reads", "direct", "--gather", "on,off",
                          "--tokens", "6", "--warmup", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == []
    rows = {r["gather"]: r for r in result["rows"]}
    assert set(rows) == {True, False} and all(r["expert_reads"] == "direct" for r in rows.values())
    assert rows[True]["gathered_per_token"] > 0 and rows[False]["gathered_per_token"] == 0
    # the same prompts either way: an expert that several tokens use crosses once when gathered
    assert rows[True]["h2d_bytes_per_token"] < rows[False]["h2d_bytes_per_token"]
