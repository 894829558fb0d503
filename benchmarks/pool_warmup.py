"""Hit rate of a freshly loaded engine's pool over the llama.cpp kit's schedule, run after run.

The kit loads an engine with half (or a quarter) of the experts pooled and measures, on that one engine,
each prefetch depth in turn: batch 1 after a 512-token prompt (an untimed run of 16 tokens, then
``--reps`` runs of 128), then 8 sequences after 128-token prompts. Its batch-1 row reports the slower of
two runs, the first after load. This replays that schedule on the CPU (float32, direct reads) at 12
layers x 128 experts, top-8, with trained-like routing, and prints the hit rate of every timed run:
hit rates depend on the routing and the policy, not on the device.

    python benchmarks/pool_warmup.py --out benchmarks/results/pool_warmup_DATE.json

``prompt-ranked`` (the engine) ranks the experts a prompt's chunk brings in by how many of its tokens use
each (engine/experts/copy_path.CHUNK_TOKENS); ``unranked`` turns that off (every chunk counted as a
decode step's call: each miss admitted over the coldest key, in expert order).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment  # noqa: E402
from benchmarks.synthetic_moe import SMOKE, TrainedLike, base_std, build_hf, make_trained_like, strata_engine  # noqa: E402
from engine.experts import copy_path  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

SHAPE = dict(SMOKE, num_hidden_layers=12, num_experts=128, num_experts_per_tok=8, max_position_embeddings=1024)


def timed_hit_rate(engine, prompts: list[list[int]], gen: int, seed: int) -> float:
    """One kit run: the requests' prefill (one step), then ``gen`` decode steps; the hit rate of the latter."""
    prov = engine.loaded.experts
    for i, p in enumerate(prompts):
        engine.add_request(None, p, SamplingParams(max_tokens=gen + 1, temperature=1.0, seed=seed + i,
                                                   ignore_eos=True))
    engine.step()
    base = prov.stats()
    while engine.has_unfinished():
        engine.step()
    st = prov.stats()
    hits, misses = st.hits - base.hits, st.misses - base.misses
    return hits / max(1, hits + misses)


def schedule(hf, cfg, share: str, depths: list[int], reps: int) -> list[dict]:
    engine, _ = strata_engine(hf, cfg, "bf16", 8, "float32", "cpu", "256M", max_model_len=1024,
                              expert_reads="direct", prefetch_depth=depths[0], expert_pool_size=share)
    rows = []
    for depth in depths:
        if depth != depths[0]:
            engine.reconfigure(prefetch_depth=depth)
        for batch, plen, n in ((1, 512, reps), (8, 128, 1)):
            g = torch.Generator().manual_seed(1000 + 7 * batch + plen)   # the kit's prompts
            prompts = torch.randint(10, cfg.vocab_size, (batch, plen), generator=g).tolist()
            timed_hit_rate(engine, prompts, 16, 99)                          # the untimed run
            rates = [timed_hit_rate(engine, prompts, 128, 1000 * (r + 1)) for r in range(n)]
            rows.append({"depth": depth, "batch": batch, "prompt": plen, "hit_rates": rates})
    engine.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", default="50%,25%")
    ap.add_argument("--reps", type=int, default=3, help="timed batch-1 runs per depth (the kit: 2)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    std = base_std(SHAPE)
    torch.manual_seed(0)
    hf, cfg = build_hf(SHAPE, torch.float32, std, "cpu")
    calib = torch.randint(10, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(2))
    construction = make_trained_like(hf, std, TrainedLike(), calib)
    ranked_at = copy_path.CHUNK_TOKENS
    cells = []
    for share in args.shares.split(","):
        for mode, chunk in (("unranked", 10 ** 9), ("prompt-ranked", ranked_at)):
            for depths in ([2, 0], [0, 2]):
                copy_path.CHUNK_TOKENS = chunk
                rows = schedule(hf, cfg, share, depths, args.reps)
                cells.append({"share": share, "mode": mode, "depths": depths, "rows": rows})
                for r in rows:
                    print(f"{share} {mode:13s} order {depths}: depth {r['depth']} b{r['batch']}: "
                          + " ".join(f"{100 * x:.1f}%" for x in r["hit_rates"]), flush=True)
    copy_path.CHUNK_TOKENS = ranked_at
    result = {"environment": environment(), "benchmark": "pool_warmup",
              "what": "Hit rate of each timed run of the llama.cpp kit's schedule on one freshly loaded engine "
                      "(CPU, 12 layers x 128 experts, top-8, trained-like routing), with the prompt's chunks "
                      "ranking the experts they admit and without",
              "shape": SHAPE, "routing": "trained-like",
              "routing_construction": {k: v for k, v in construction.items() if not isinstance(v, list)},
              "chunk_tokens": ranked_at, "cells": cells}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
