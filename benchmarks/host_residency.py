"""Host time of the expert residency per direct-read decode step, without a GPU and without the MoE math.

Drives the expert manager on the CPU as a decode step does — ``begin_step``, then per MoE layer
``before_layer`` and ``acquire`` with direct reads (eager: one read of ids per layer), then
``end_step`` — over a Qwen3-30B-A3B-sized table (48 MoE layers, 128 experts, top-8)
of tiny experts, so what is timed is the residency's own bookkeeping: reading ids, counting, choosing
fills and admissions, ending steps. Routing is skewed (Zipf over a fixed per-layer popularity) with
tokens that keep some of their last experts. Run from a tree's root to time that tree (older trees
name the manager ``OffloadedExperts``; the script takes either):

    python3 benchmarks/host_residency.py --steps 300 --batches 1,8 [--out FILE]

Prints microseconds per step (median of rounds, and the fastest round) per batch size.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.experts.store import HostExpertStore  # noqa: E402
from kernels.expert_layout import ExpertLayout  # noqa: E402

try:
    from engine.experts.manager import ExpertManager as Manager  # noqa: E402
except ImportError:                           # an older tree
    from engine.experts.manager import OffloadedExperts as Manager  # noqa: E402

L, E, K, D, F = 48, 128, 8, 16, 8


def _route(logits: torch.Tensor):
    w, ids = torch.topk(torch.softmax(logits.float(), -1), K, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def _routing(steps: int, batch: int, seed: int) -> torch.Tensor:
    """ids [steps, L, batch, K]: Zipf popularity per layer, each token keeping half its last experts."""
    g = torch.Generator().manual_seed(seed)
    pop = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** 0.8
    perms = [torch.randperm(E, generator=g) for _ in range(L)]
    out = torch.empty(steps, L, batch, K, dtype=torch.int64)
    last = None
    for s in range(steps):
        for layer in range(L):
            for t in range(batch):
                fresh = perms[layer][torch.multinomial(pop, K, generator=g)]
                if last is not None and torch.rand((), generator=g) < 0.5:
                    keep = last[layer, t][: K // 2]
                    fresh = torch.cat([keep, fresh[~torch.isin(fresh, keep)]])[:K]
                out[s, layer, t] = fresh
        last = out[s]
    return out


def run(batch: int, steps: int, rounds: int) -> list[float]:
    layout = ExpertLayout.make("fp32", D, F)
    store = HostExpertStore.allocate(L, E, layout, pin=False)
    g = torch.Generator().manual_seed(0)
    routers = [torch.randn(E, D, generator=g) for _ in range(L)]
    prov = Manager(layout, store, E, "cpu", L * E // 2 * layout.nbytes, 2, "adaptive", routers, _route,
                   direct_reads=True)
    ids = _routing(steps * rounds, batch, seed=batch)
    hidden = torch.randn(batch, D, generator=g)
    per_round = []
    for r in range(rounds):
        t0 = time.perf_counter()
        for s in range(r * steps, (r + 1) * steps):
            prov.begin_step()
            for layer in range(L):
                prov.before_layer(layer, hidden)
                prov.acquire(layer, ids[s, layer])
            prov.end_step()
        per_round.append((time.perf_counter() - t0) / steps * 1e6)
    prov.close()
    return per_round


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {"benchmark": "host time of the residency per direct-read step", "shape": {"layers": L, "experts": E,
              "top_k": K}, "pool": 0.5, "depth": 2, "policy": "adaptive", "steps": args.steps, "rows": []}
    for b in (int(x) for x in args.batches.split(",")):
        rounds = run(b, args.steps, args.rounds)
        row = {"batch": b, "us_per_step": statistics.median(rounds), "min_us_per_step": min(rounds),
               "rounds_us": rounds}
        result["rows"].append(row)
        print(f"batch {b:3d}: {row['us_per_step']:9.0f} us per step, fastest round {min(rounds):.0f} "
              f"(rounds {', '.join(f'{x:.0f}' for x in rounds)})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
