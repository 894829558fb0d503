"""Expert offload on the GPU: decode tok/s against pool size and prefetch depth, bytes over the bus.

The model is the MoE path of a Qwen3-30B-A3B-shaped network (48 MoE layers, 128 experts, top-8,
hidden 2048, expert FFN 768, bf16) with random weights made in memory: per layer a router, the
provider (``ExpertManager``) and the Triton fused MoE, with a residual. Attention, norms, the
embedding and the LM head are left out: they are resident and cost the same in every
configuration, so leaving them out isolates what residency changes (and is stated in the JSON).

Routing: random routers on random token states, i.e. near-uniform routing, the worst case for a
cache (hit rate ~ pool fraction). The prefetcher's guesses come from applying later layers'
routers to the current hidden state; with small random expert outputs the residual stream drifts
little across layers, so guesses are better than a real model's: prefetch hits are reported.

Each figure comes with its limit: bus bytes per token / measured pinned bandwidth (the copy
roofline) and the GB/s the copies achieved. Usage (GPU):

    python benchmarks/bench_offload.py --out benchmarks/results/offload_DATE.json
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.expert_layout import ExpertLayout          # noqa: E402
from engine.experts.manager import ExpertManager     # noqa: E402
from engine.experts.store import HostExpertStore        # noqa: E402

BUS_GBS = 55.0   # pinned host->device, measured on the H200 test machine (DESIGN.md §1)


def route(top_k: int):
    def fn(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, ids = torch.topk(torch.softmax(logits.float(), -1), top_k, dim=-1)   # [T, k]
        return w / w.sum(-1, keepdim=True), ids
    return fn


def moe_fn():
    try:
        from kernels.fused_moe import fused_moe
        return fused_moe, "triton fused_moe"
    except ImportError:
        from kernels.fused_moe import fused_moe_ref
        return fused_moe_ref, "fused_moe_ref"


def build(args, dev: torch.device) -> tuple[HostExpertStore, list[torch.Tensor], ExpertLayout]:
    """Pinned host store filled with random bf16 experts (made on the GPU, copied down per layer)."""
    layout = ExpertLayout.make("bf16", args.hidden, args.ffn)
    store = HostExpertStore.allocate(args.layers, args.experts, layout, pin=True, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    for l in range(args.layers):
        vals = torch.randn(args.experts, layout.nbytes // 2, device=dev, generator=g, dtype=torch.bfloat16)
        store.layer_rows(l).copy_((vals * 0.02).view(torch.uint8))
    torch.cuda.synchronize()
    routers = [torch.randn(args.experts, args.hidden, device=dev, dtype=torch.bfloat16, generator=g)
               / args.hidden ** 0.5 for _ in range(args.layers)]
    return store, routers, layout


def bus_bandwidth(store: HostExpertStore, dev: torch.device) -> dict:
    """Pinned H2D GB/s: one large copy, and back-to-back copies of single experts."""
    rows = store.rows
    n = min(rows.shape[0], max(1, (1 << 30) // rows.shape[1]))
    dst = torch.empty(n, rows.shape[1], dtype=torch.uint8, device=dev)
    out = {}
    for name, fn in (("bulk_1GiB", lambda: dst.copy_(rows[:n], non_blocking=True)),
                     ("per_expert", lambda: [dst[i].copy_(rows[i], non_blocking=True) for i in range(n)])):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out[name] = 3 * n * rows.shape[1] / (time.perf_counter() - t0) / 1e9
    return out


def decode(prov, routers, layout, top_k, batch, tokens, moe, emb, step0):
    """``tokens`` decode steps of ``batch`` sequences through every MoE layer; returns seconds."""
    rf = route(top_k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for t in range(tokens):
        x = emb[(step0 + t) % emb.shape[0], :batch]                       # [B, D]
        prov.begin_step()
        for l, router in enumerate(routers):
            prov.before_layer(l, x)
            w, ids = rf(x @ router.t())                                   # [B, k]
            slot_of, views = prov.acquire(l, ids)
            x = x + moe(x, ids, w, slot_of, views, layout)                # [B, D]
        prov.end_step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(prov, args, routers, layout, moe, emb, batch, depth, step0) -> dict:
    prov.reconfigure(prefetch_depth=depth)
    decode(prov, routers, layout, args.top_k, batch, args.warmup, moe, emb, step0)
    s0, syncs0, sync_ms0 = prov.stats(), prov.host_syncs, prov.counters.sync_ms
    tokens = args.tokens if batch == 1 else max(2, args.tokens // 2)
    sec = decode(prov, routers, layout, args.top_k, batch, tokens, moe, emb, step0 + args.warmup)
    s1 = prov.stats()
    h2d = s1.h2d_bytes - s0.h2d_bytes
    looked = (s1.hits + s1.misses) - (s0.hits + s0.misses)
    bus_per_tok = h2d / tokens
    return {
        "batch": batch, "depth": depth, "tokens": tokens, "seconds": sec,
        "tok_s": batch * tokens / sec, "step_ms": 1e3 * sec / tokens,
        "h2d_bytes_per_step": bus_per_tok, "h2d_gb_s": h2d / sec / 1e9,
        "copy_wait_ms_per_step": (s1.copy_wait_ms - s0.copy_wait_ms) / tokens,
        "hit_rate": (s1.hits - s0.hits) / looked if looked else 1.0,
        "misses_per_step": (s1.misses - s0.misses) / tokens,
        "prefetch_hits_per_step": (s1.prefetch_hits - s0.prefetch_hits) / tokens,
        "prefetch_wasted_per_step": (s1.prefetch_wasted - s0.prefetch_wasted) / tokens,
        "host_syncs_per_step": (prov.host_syncs - syncs0) / tokens,
        "host_sync_ms_per_step": (prov.counters.sync_ms - sync_ms0) / tokens,
        "zero_copy_readback": prov._reader.zero_copy,
        "roofline_step_ms": 1e3 * bus_per_tok / (args.bus_gbs * 1e9),
    }


def run_pool(frac, args, store, routers, layout, moe, emb, budget, dev) -> list[dict]:
    total = args.layers * args.experts
    slots = round(frac * total)
    torch.cuda.reset_peak_memory_stats(dev)
    prov = ExpertManager(layout, store, args.experts, dev, slots * layout.nbytes, 0, "lfu", routers,
                            route(args.top_k), budget_bytes=budget)
    decode(prov, routers, layout, args.top_k, 8, args.fill, moe, emb, 10_000)   # warm the pool
    rows = []
    for batch in args.batches:
        for depth in args.depths:
            r = measure(prov, args, routers, layout, moe, emb, batch, depth, 100 * len(rows))
            r.update(pool_fraction=frac, pool_slots=slots, pool_bytes=prov.pool.bytes)
            rows.append(r)
            print(json.dumps(r), flush=True)
    peak = torch.cuda.max_memory_allocated(dev)
    for r in rows:
        r["max_memory_allocated"] = peak
    prov.close()
    del prov
    torch.cuda.empty_cache()
    return rows


def versions(dev: torch.device) -> dict:
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        drv = None
    return {"gpu": torch.cuda.get_device_name(dev), "driver": drv, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": tv, "python": platform.python_version()}


def table(rows: list[dict]) -> str:
    head = f"{'pool':>5} {'B':>2} {'d':>2} {'tok/s':>8} {'step ms':>8} {'roof ms':>8} {'GB/s':>6} {'wait ms':>8} {'hit':>5} {'pf hit':>6} {'sync ms':>7} {'MiB alloc':>9}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['pool_fraction']:>5.0%} {r['batch']:>2} {r['depth']:>2} {r['tok_s']:>8.2f} {r['step_ms']:>8.1f} "
                     f"{r['roofline_step_ms']:>8.1f} {r['h2d_gb_s']:>6.1f} {r['copy_wait_ms_per_step']:>8.1f} "
                     f"{r['hit_rate']:>5.2f} {r['prefetch_hits_per_step']:>6.0f} {r['host_sync_ms_per_step']:>7.1f} {r['max_memory_allocated'] / 2**20:>9.0f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--pools", default="0,0.25,0.5,1.0")
    p.add_argument("--depths", default="0,1,2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--tokens", type=int, default=8, help="timed decode steps at batch 1 (half at larger batches)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--fill", type=int, default=3, help="batch-8 steps that warm each pool before timing")
    p.add_argument("--budget", type=float, default=None, help="GiB; default: free memory of the card")
    p.add_argument("--bus-gbs", type=float, default=BUS_GBS)
    p.add_argument("--commit", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.pools = [float(v) for v in args.pools.split(",")]
    args.depths = [int(v) for v in args.depths.split(",")]
    args.batches = [int(v) for v in args.batches.split(",")]
    dev = torch.device("cuda")
    free, total_mem = torch.cuda.mem_get_info(dev)
    budget = int(args.budget * 2**30) if args.budget else free
    t0 = time.perf_counter()
    store, routers, layout = build(args, dev)
    print(store.describe(), f"(built in {time.perf_counter() - t0:.1f} s)", flush=True)
    bw = bus_bandwidth(store, dev)
    print("pinned H2D GB/s:", bw, flush=True)
    moe, moe_name = moe_fn()
    emb = torch.randn(64, 8, args.hidden, device=dev, dtype=torch.bfloat16)      # token states per step
    resident = sum(r.numel() * r.element_size() for r in routers)
    rows = []
    for frac in args.pools:
        rows += run_pool(frac, args, store, routers, layout, moe, emb, budget - resident, dev)
    doc = {"benchmark": "bench_offload", "commit": args.commit, "date": time.strftime("%Y-%m-%d"),
           "versions": versions(dev), "moe_kernel": moe_name,
           "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
           "model": "Qwen3-30B-A3B-shaped MoE path only (routers + routed experts, attention omitted)",
           "routing": "random routers on random token states: near-uniform, worst case for a cache",
           "expert_bytes": layout.nbytes, "host_store": {"bytes": store.nbytes, "pinned": store.pinned,
                                                         "pin_seconds": store.pin_seconds, "numa": store.numa.describe()},
           "measured_h2d_gb_s": bw, "budget_bytes": budget, "card_total_bytes": total_mem,
           "roofline": f"step_ms >= h2d bytes per step / {args.bus_gbs} GB/s", "results": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"budget {budget / 2**30:.1f} GiB, expert {layout.nbytes / 2**20:.2f} MiB, {moe_name}, bw {bw}")
    print(table(rows))


if __name__ == "__main__":
    main()
