"""Where the GPU memory of an offloaded model goes: the plan's accounts against what torch allocates.

A Qwen3-30B-A3B-shaped random model (12 layers unless ``--layers``, as in the llama.cpp kit) loads
with a share of its experts in the pool (``--pool``, default 0%) and runs the kit's scenarios: one
sequence after a 512-token prompt, then 8 sequences after 128-token prompts. For every phase the
script records allocated and peak bytes, and at the run's peak the live allocations grouped by the
engine's own frame that made them (torch's allocator history), so each byte the plan does not account
for has a name:

    python benchmarks/memory_profile.py --format int4 --pool 0 --out mem.json

``--smoke`` runs a tiny shape on the CPU (sizes only; no allocator history there).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment, write_result  # noqa: E402
from benchmarks.synthetic_moe import QWEN3_30B, SMOKE, base_std, build_hf, strata_engine  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[1])


def kit_kv(shape: dict, scenarios: list[tuple[int, int]], gen: int, cuda: bool) -> dict:
    """The kit's KV sizing: max_model_len and a cache for the largest scenario (as llama.cpp's -c)."""
    longest = max(p for _, p in scenarios) + gen + 1
    tokens = max(b * 16 * math.ceil((p + gen + 17) / 16) for b, p in scenarios)
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * (2 if cuda else 4)
    return {"max_model_len": 64 * math.ceil(longest / 64), "kv_cache_size": str(int(1.5 * tokens * per_token))}


def run(engine, batch: int, prompt_len: int, gen: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    vocab = engine.loaded.spec.vocab_size
    for i in range(batch):
        ids = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        engine.add_request(None, ids, SamplingParams(max_tokens=gen, temperature=1.0, seed=seed + i, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


def owner(frames: list[dict]) -> str:
    """The innermost frame in the project's own code that led to an allocation."""
    for f in frames:
        name = f.get("filename", "")
        if name.startswith(ROOT) and "/benchmarks/" not in name:
            return f"{name[len(ROOT) + 1:]}:{f.get('line')} {f.get('name')}"
    return "(outside the engine)"


def live_at_peak(snapshot: dict) -> tuple[int, list[tuple[str, int]]]:
    """Replay the allocator trace: the peak of live bytes and the live set at it, by owner."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snapshot.get("device_traces", []):
        for ev in trace:
            action, addr, size = ev.get("action"), ev.get("addr"), ev.get("size", 0)
            if action == "alloc":
                live[addr] = (size, owner(ev.get("frames", [])))
                total += size
                if total > peak:
                    peak, at_peak = total, dict(live)
            elif action in ("free_requested", "free_completed") and addr in live:
                if action == "free_requested":
                    total -= live.pop(addr)[0]
    groups: collections.Counter = collections.Counter()
    for size, who in at_peak.values():
        groups[who] += size
    return peak, groups.most_common(25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="int4")
    ap.add_argument("--pool", type=float, default=0.0, help="share of the experts in the pool, in percent")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--resident-weights", default="auto")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = not args.smoke
    shape = dict(SMOKE) if args.smoke else dict(QWEN3_30B, num_hidden_layers=args.layers)
    device = "cuda" if cuda else "cpu"
    scenarios = [(1, args.prompt if cuda else 64), (8, 128 if cuda else 16)]
    hf, cfg = build_hf(shape, torch.bfloat16 if cuda else torch.float32, base_std(shape), device)
    hf.to("cpu")                         # the checkpoint lives on the host, as a folder on disk would
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    phases = []

    def mark(name: str) -> None:
        row = {"phase": name}
        if cuda:
            torch.cuda.synchronize()
            row.update(allocated=torch.cuda.memory_allocated(), peak=torch.cuda.max_memory_allocated(),
                       reserved=torch.cuda.memory_reserved())
            torch.cuda.reset_peak_memory_stats()
        phases.append(row)
        print(name, {k: (f"{v / 2**20:.0f} MiB" if isinstance(v, int) else v) for k, v in row.items()}, flush=True)

    kv = kit_kv(shape, scenarios, args.gen, cuda)
    engine, _ = strata_engine(hf, cfg, args.format, max(b for b, _ in scenarios), "bfloat16" if cuda else "float32",
                              device, kv_cache_size=kv["kv_cache_size"], max_model_len=kv["max_model_len"],
                              expert_pool_size=f"{args.pool:g}%", prefetch_depth=args.depth,
                              resident_weights=args.resident_weights)
    mark("load")
    for batch, plen in scenarios:
        run(engine, batch, plen, args.gen, seed=batch)
        mark(f"batch {batch} after {plen}-token prompts")
    memory = dataclasses.asdict(engine.stats().memory)
    result = {"benchmark": "memory_profile" + ("_smoke" if args.smoke else ""), "environment": environment(),
              "model": shape, "config": vars(args), "phases": phases, "memory": memory}
    if cuda:
        peak, groups = live_at_peak(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
        result["peak_live_bytes"] = peak
        counted = sum(memory[k] for k in ("resident_bytes", "expert_pool_bytes", "kv_cache_bytes", "kv_window_bytes",
                                          "workspace_bytes"))
        result["counted_bytes"] = counted
        result["peak_within_plan"] = max(r.get("peak", 0) for r in phases) <= counted
        result["peak_by_owner"] = [{"owner": who, "bytes": size} for who, size in groups]
        print(f"\npeak {peak / 2**20:.0f} MiB, the plan counts {counted / 2**20:.0f} MiB; accounted: " + ", ".join(
            f"{k} {v / 2**20:.0f}" for k, v in memory.items() if k.endswith("_bytes") and isinstance(v, int)))
        for who, size in groups:
            print(f"{size / 2**20:9.1f} MiB  {who}")
    engine.close()
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
