"""Greedy tokens of the end-to-end benchmark's tiny model, for comparing two commits on one GPU.

Run from a tree's root (its own ``engine`` first on the path); prints one JSON object: the greedy
tokens of three prompts with every expert resident, and with half the experts in an offloaded pool
at prefetch depth 0 and 2 (direct reads and CUDA graphs where the GPU allows). Two commits whose
outputs are equal decode identically.

    python3 benchmarks/greedy_tokens.py > tokens.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.bench_e2e import TINY, _greedy, build_hf, strata_engine  # noqa: E402

PROMPTS = [[1, 5, 77, 300, 12, 9], [1, 99, 4], [1, 250, 251, 252]]


def main() -> None:
    hf, cfg = build_hf(TINY, torch.float32, 0.08)
    engine, _ = strata_engine(hf, cfg, "auto", 4, "float32")
    out = {"resident": _greedy(engine, PROMPTS, 32)}
    half = engine.loaded.layout.nbytes * cfg.num_experts * cfg.num_hidden_layers // 2
    engine.close()
    for depth in (0, 2):
        off, _ = strata_engine(hf, cfg, "auto", 4, "float32", expert_pool_size=half, prefetch_depth=depth)
        out[f"half_pool_depth{depth}"] = _greedy(off, PROMPTS, 32)
        off.close()
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
