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


def test_the_trajectory_says_what_each_step_ran_and_splits_the_timed_steps_in_halves():
    import numpy as np
    from types import SimpleNamespace
    sys.path.insert(0, str(ROOT))
    from benchmarks.predict_ab import follow_steps, trajectory
    seen = []
    experts = SimpleNamespace(direct=SimpleNamespace(shares=SimpleNamespace(frac=SimpleNamespace(
        numpy=lambda: np.array([0.375]))), choice=SimpleNamespace(replayed=True)))
    experts.observe_step = lambda tokens, eager, seconds, recorded=None: seen.append(tokens)
    steps, stop = follow_steps(experts)
    experts.observe_step(1, True, 0.004)                 # an eager step: no recording, no share
    for _ in range(4):
        experts.observe_step(1, False, 0.002, 1)         # replayed, predicting, at the share set
    stop()
    experts.observe_step(1, False, 0.002, 1)             # no longer followed
    assert seen == [1] * 6 and len(steps) == 5
    t = trajectory(steps, timed=4)
    assert t["warmup"] == {"steps": 1, "mean_ms": 4.0, "eager": 1, "predicting": 0, "cpu_shares": {"0.000": 1}}
    assert t["first_half"]["steps"] == t["second_half"]["steps"] == 2
    assert t["second_half"]["predicting"] == 2 and t["second_half"]["cpu_shares"] == {"0.375": 2}
