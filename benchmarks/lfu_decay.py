"""Hit rate of the LFU policy against its decay, half the experts in the pool.

    python benchmarks/lfu_decay.py --out benchmarks/results/lfu_decay_<date>.json

Runs on the CPU (float32, direct reads, prefetch depth 2) at 12 layers x 64 experts, top-8 (the
``--smoke`` shape of bench_e2e.py with more layers and experts): hit rates depend on the routing and
the policy, not on the device. ``--routing trained-like`` (default) reshapes the random model's routers
to a trained model's statistics; ``uniform`` keeps the random model's own routing, which reuses each
sequence's recent experts. Each (batch, decay) decodes seeded samples from the same prompts; the
first 40 steps warm the pool and are not counted.
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
from engine.sampling import SamplingParams  # noqa: E402

SHAPE = dict(SMOKE, num_hidden_layers=12, num_experts=64, num_experts_per_tok=8)
WARM_STEPS = 40


def hit_rate(hf, cfg, batch: int, decay: float | str, steps: int) -> dict:
    """``decay``: an LFU decay, or ``adaptive`` for :class:`engine.experts.policy.AdaptiveLFUPolicy`."""
    engine, _ = strata_engine(hf, cfg, "bf16", 8, "float32", "cpu", "256M", expert_reads="direct",
                              prefetch_depth=2, expert_pool_size="50%")
    prov = engine.loaded.experts
    if decay == "adaptive":
        engine.reconfigure(expert_policy="adaptive")
    else:
        prov.policy._growth = 1.0 / decay
    gen = torch.Generator().manual_seed(1)
    for i, p in enumerate(torch.randint(10, cfg.vocab_size, (batch, 16), generator=gen).tolist()):
        engine.add_request(None, p, SamplingParams(max_tokens=WARM_STEPS + steps, temperature=1.0, seed=i,
                                                   ignore_eos=True))
    n, base = 0, None
    while engine.has_unfinished():
        engine.step()
        n += 1
        if n == WARM_STEPS:
            base = prov.stats()
    st = prov.stats()
    engine.close()
    hits, misses = st.hits - base.hits, st.misses - base.misses
    row = {"batch": batch, "decay": decay, "hit_rate": hits / (hits + misses), "misses": misses, "steps": steps}
    if decay == "adaptive":
        row["active_decay_at_end"] = prov.policy.decay
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decays", default="0.8,0.9,0.95,0.98,0.99,0.995",
                    help="LFU decays to compare, and 'adaptive' for the adaptive policy")
    ap.add_argument("--routing", choices=("trained-like", "uniform"), default="trained-like")
    ap.add_argument("--experts", type=int, default=SHAPE["num_experts"], help="experts per layer (top-8 of them)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    shape = dict(SHAPE, num_experts=args.experts)
    std = base_std(shape)
    hf, cfg = build_hf(shape, torch.float32, std, "cpu")
    calib = torch.randint(10, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(2))
    construction = make_trained_like(hf, std, TrainedLike(), calib) if args.routing == "trained-like" else {}
    rows = []
    for batch, steps in ((1, 360), (8, 80)):
        for decay in (d if d == "adaptive" else float(d) for d in args.decays.split(",")):
            rows.append(hit_rate(hf, cfg, batch, decay, steps))
            r = rows[-1]
            print(f"batch {batch} decay {decay}: hit rate {r['hit_rate']:.4f}, {r['misses']} misses"
                  + (f", active decay at the end {r['active_decay_at_end']}" if "active_decay_at_end" in r else ""),
                  flush=True)
    result = {"environment": environment(), "benchmark": "lfu_decay_hit_rate", "shape": shape,
              "routing": args.routing,
              "routing_construction": {k: v for k, v in construction.items() if not isinstance(v, list)},
              "pool_fraction": 0.5, "prefetch_depth": 2, "warm_steps": WARM_STEPS, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
