"""benchmarks/predict_ab.py on a tiny model on the CPU: every variant of every cell is timed on one engine
per cell, and the variants are what they say (depth 0, or depth 2)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_variant_of_each_cell_is_timed(tmp_path):
    out = tmp_path / "ab.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "predict_ab.py"), "--smoke", "--formats", "bf16",
                          "--shares", "50", "--tokens", "4", "--warmup", "2", "--out", str(out),
                          "--variants", "depth0,tuned,predict,tuned1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == []
    cells = {(r["variant"], r["batch"]) for r in result["rows"]}
    assert cells == {(v, b) for v in ("depth0", "tuned", "predict", "tuned1") for b in (1, 8)}
    assert all(r["tokens"] == 4 * r["batch"] and r["tok_s"] > 0 for r in result["rows"])
    assert "tuned/depth0" in run.stdout and "tuned/tuned1" in run.stdout          # the summary's ratios
