"""engine/collector.py: the imports' objects leave the cyclic collector before the first model; the
models loaded after it are still collected when they close. Run in a fresh interpreter, since the test
session has frozen its own imports."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import gc, json, sys, time, weakref
    from engine.collector import freeze_imports
    from engine import LLM, SamplingParams

    def full_collection_s():
        t0 = time.perf_counter()
        gc.collect()
        return time.perf_counter() - t0

    before = len(gc.get_objects())
    frozen = freeze_imports()
    again = freeze_imports()
    left = len(gc.get_objects())
    models = []
    for _ in range(2):
        llm = LLM(sys.argv[1], device="cpu", expert_pool_size="50%")
        llm.generate(["hello there"], SamplingParams(max_tokens=4, temperature=0.0))
        ref = weakref.ref(llm.engine.loaded)
        llm.engine.close()
        del llm
        models.append(ref)
    gc.collect()
    print(json.dumps({"before": before, "frozen": frozen, "again": again, "left": left,
                      "alive": [r() is not None for r in models], "count": gc.get_freeze_count()}))
""")


def test_a_model_loaded_after_the_imports_are_frozen_is_collected_when_it_closes(tmp_path):
    model = build_tiny_model(tmp_path / "m", "qwen3_moe")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(model)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["frozen"] >= got["before"] // 2, got          # torch and the engine: most of the heap
    assert got["again"] == 0, got                                     # once a process
    assert got["count"] <= got["frozen"], got      # nothing frozen since (a frozen object freed leaves it)
    assert got["left"] < got["before"] // 10, got          # a collection now walks a tenth or less
    assert got["alive"] == [False, False], "a closed model outlived the collection: it was frozen"
