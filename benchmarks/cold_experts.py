"""Cold experts over the bus against the bus and the host CPU together (``cold_experts`` bus / auto / cpu).

A Qwen3-30B-A3B-shaped random model (``--layers`` layers, default 12 as in the llama.cpp kit) with a
small pool, decode tok/s per setting, each row after a warm-up, all in one process:

    python benchmarks/cold_experts.py --formats bf16,int4 --pools 0 --depths 0,2 --batches 1,8 \
        --modes bus,auto,cpu --gather on,off,all --out cold.json

``--gather all,on,off`` times each setting with every missing expert of a step copied in once by the
gather's kernel before the layer's MoE kernels (engine/experts/gather.py, the default; steps of one
token too), with only those two or more of its tokens use (the kernels read the others from host
memory), and without, re-recording the decode graphs in between.

Each row also reports where the missing experts ran (CPU / bus per token), the CPU's busy share of
the step time, the cost model's predicted time for the layers with a CPU share against the measured
one, the bus bytes per token, and the rates the cost model measured (bus GB/s, CPU GB/s at 1 token).
The combined limit of a row is (bus GB/s + CPU GB/s) for the bytes of the missing experts.
``--smoke`` runs a tiny shape on the CPU (what tests/engine/test_cold_experts_bench.py does).
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.offload_sweep import Sweep, sampled_decode  # noqa: E402
from benchmarks.synthetic_moe import QWEN3_30B, SMOKE, base_std, build_hf, strata_engine  # noqa: E402
import engine.experts.store as store_mod  # noqa: E402
from engine.experts.store import huge_page_bytes  # noqa: E402


def set_gather(engine, on: bool, min_uses: int = 2) -> bool:
    """Gather missing experts that ``min_uses`` or more tokens of a step use (``on``; 1: every one) or
    read them once per token, from the next step on, with the decode graphs recorded again; False where
    the store cannot gather."""
    experts = engine.loaded.experts
    gather = experts.direct.gather
    if gather.enabled == on and (not on or gather.min_uses == min_uses):
        return True
    if not experts.set_gather(on, min_uses):
        return False
    if engine.runner.graphs is not None:
        engine.runner.graphs.reset()
    return True


def profiled(fn, top: int):
    """``fn()`` under cProfile (the calling thread: the one that follows the steps); returns its result and
    the ``top`` functions by own time: (function, calls, own seconds, cumulative seconds)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    try:
        res = fn()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).stats           # (file, line, name) -> (calls, prim, own, cum, callers)
    rows = sorted(((f"{Path(f).name}:{ln}({name})", v[1], v[2], v[3]) for (f, ln, name), v in stats.items()),
                  key=lambda r: -r[2])
    return res, rows[:top]


def row(engine, sweep: Sweep, fmt: str, pool: float, depth: int, mode: str, batch: int, prompts,
        gather: str = "on", reads: str = "auto", profile: int = 0) -> dict:
    experts = engine.loaded.experts
    total = engine.loaded.plan.expert_bytes * engine.loaded.spec.num_moe_layers * engine.loaded.spec.num_experts
    engine.reconfigure(expert_pool_size=int(total * pool), prefetch_depth=depth, cold_experts=mode, expert_reads=reads)
    if not set_gather(engine, gather != "off", 1 if gather == "all" else 2):
        raise ValueError(f"this store cannot {'leave off gathering' if gather == 'off' else 'gather'}")
    trace = experts.direct.trace
    trace.start(4)                                  # the host's timeline of the last replayed steps
    try:
        prof: list = []
        around = (lambda run: prof.extend(profiled(run, profile)[1])) if profile else None   # noqa: E731
        n, secs, before, after, host_wait, _ = sampled_decode(engine, prompts, sweep, seed=17, around=around)
    finally:
        trace.stop()
    d = lambda f: getattr(after, f) - getattr(before, f)   # noqa: E731
    rates = experts.cold.rates
    out = {"format": fmt, "pool_fraction": pool, "depth": depth, "cold_experts": mode, "batch": batch,
           "expert_reads": reads, "gather": gather != "off", "gather_min_uses": 1 if gather == "all" else 2,
           "gathered_per_token": d("gathered") / n,
           "tokens": n, "tok_s": n / secs, "ms_per_token": 1e3 * secs / n,
           "cpu_experts_per_token": d("cpu_experts") / n, "bus_experts_per_token": d("bus_experts") / n,
           "misses_per_token": d("misses") / n, "h2d_bytes_per_token": d("h2d_bytes") / n,
           "cpu_busy_share": d("cpu_ms") / d("steps_ms") if d("steps_ms") else 0.0,
           "cold_predicted_ms_per_token": d("cold_predicted_ms") / n,
           "cold_measured_ms_per_token": d("cold_measured_ms") / n,
           "host_wait_ms_per_token": host_wait / n, "arms_s": {str(t): v for t, v in experts.cold.arms.state().items()},
           # each recording's share tuner (quiet, predicting), keyed "<tokens> <recording>"
           "graph_shares": ({f"{t} {'predicting' if p else 'quiet'}": {"share": sh, "step_s_by_share":
                                                                        {str(k): v for k, v in tried.items()}}
                             for p, tuner in experts.direct.shares.tuners.items()
                             for t, (sh, tried) in tuner.state().items()}
                            if experts.direct.shares is not None else None),
           "predicting": {str(t): {"on": on, "step_s": {("predicting" if k else "quiet"): v for k, v in times.items()}}
                          for t, (on, times) in experts.direct.choice.predict_tuner.state().items()},
           "expert_bytes": experts.layout.nbytes,
           "host_trace_us": trace.summary(),            # and the last traced step's events
           "host_trace": [list(e) for e in trace.events if e[0] == trace.events[-1][0]] if trace.events else []}
    if prof:
        out["profile_own_s"] = [list(r) for r in prof]
    if rates is not None:
        import numba
        try:
            out["numba_threading_layer"] = numba.threading_layer()
        except ValueError:
            out["numba_threading_layer"] = None
        out.update(bus_gb_s=rates.bus_bytes_per_s / 1e9,
                   kernel_bus_gb_s=rates.kernel_bus_bytes_per_s / 1e9 if rates.kernel_bus_bytes_per_s else None,
                   cpu_gb_s_1tok=experts.layout.nbytes / rates.cpu_s(1) / 1e9,
                   cpu_call_us=rates.cpu_call_s * 1e6, cpu_threads=rates.threads)
        miss_bytes = d("misses") * experts.layout.nbytes / n
        limit = miss_bytes / (rates.bus_bytes_per_s + experts.layout.nbytes / rates.cpu_s(1))
        out["cold_limit_ms_per_token"] = limit * 1e3   # missing bytes at bus + CPU rates (resident work excluded)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="bf16,int4")
    ap.add_argument("--pools", default="0")
    ap.add_argument("--depths", default="0,2")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--modes", default="bus,auto,cpu")
    ap.add_argument("--reads", default="auto", help="expert_reads: auto, direct or copy")
    ap.add_argument("--gather", default="all",
                    help="all (every missing expert: the engine's default), on (those two or more tokens use), off; "
                         "comma-separated: missing experts copied in once per step before the layer's kernels")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile each row's decode (the host thread) and keep its N functions of most own time "
                         "(the timed figures then include the profiler's cost)")
    ap.add_argument("--host-pages", default="huge",
                    help="huge (the engine's default: the host store on transparent huge pages), 4k (ordinary "
                         "pages); comma-separated: each format's engine is loaded once for each")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pages = args.host_pages.split(",")
    if set(pages) - {"huge", "4k"}:
        ap.error(f"--host-pages takes huge and 4k; got {args.host_pages}")
    shape = dict(SMOKE) if args.smoke else dict(QWEN3_30B, num_hidden_layers=args.layers)
    device = "cpu" if args.smoke else "cuda"
    hf, cfg = build_hf(shape, torch.float32 if args.smoke else torch.bfloat16, base_std(shape), device)
    gen = torch.Generator().manual_seed(1)
    batches = [int(b) for b in args.batches.split(",")]
    gathers = args.gather.split(",")
    if set(gathers) - {"on", "off", "all"}:
        ap.error(f"--gather takes on, off and all; got {args.gather}")
    result: dict = {"benchmark": "cold_experts" + ("_smoke" if args.smoke else ""), "model": shape,
                    "tokens": args.tokens, "warmup": args.warmup, "rows": [], "errors": []}
    for fmt, page in itertools.product(args.formats.split(","), pages):
        store_mod.HOST_HUGE_PAGES = page == "huge"
        sweep = Sweep(fmt, (), (), tuple(batches), args.tokens, args.warmup, device,
                      "float32" if args.smoke else "bfloat16", "1G" if args.smoke else "4G", None)
        try:
            engine, load_s = strata_engine(hf, cfg, fmt, max(batches), sweep.dtype, device, sweep.kv_cache_size,
                                           expert_pool_size="0%", prefetch_depth=0)
        except Exception as e:
            result["errors"].append({"format": fmt, "host_pages": page, "stage": "load",
                                     "error": "".join(traceback.format_exception(e))[-1500:]})
            continue
        for pool in (float(p) for p in args.pools.split(",")):
            for depth in (int(x) for x in args.depths.split(",")):
                for mode, b, gather in itertools.product(args.modes.split(","), batches, gathers):
                    if gather == gathers[0]:                     # every variant: one prompt
                        prompts = torch.randint(10, cfg.vocab_size, (b, args.prompt_len), generator=gen).tolist()
                    t0 = time.perf_counter()
                    g = {"on": "gather", "off": "no gather", "all": "gather all"}[gather]
                    try:
                        r = row(engine, sweep, fmt, pool, depth, mode, b, prompts, gather, args.reads, args.profile)
                    except Exception as e:
                        result["errors"].append({"format": fmt, "host_pages": page, "pool": pool, "depth": depth,
                                                 "mode": mode, "gather": gather,
                                                 "batch": b, "error": "".join(traceback.format_exception(e))[-6000:]})
                        print(f"{fmt} {page} pool {pool} depth {depth} {mode} {g} b{b}: failed: {e!r}"[:300], flush=True)
                        for req in list(engine.scheduler.running) + list(engine.scheduler.waiting):
                            engine.abort_now(req.request_id)   # the next row starts clean
                        continue
                    r["row_s"] = time.perf_counter() - t0
                    store = engine.loaded.experts.store
                    r["host_pages"], r["huge_page_mib"] = page, huge_page_bytes(store.rows) / 2**20 if store else 0.0
                    result["rows"].append(r)
                    print(f"{fmt:5} {page:4} pool {pool:.2f} depth {depth} {mode:4} {g:9} b{b}: "
                          f"{r['tok_s']:8.1f} tok/s  "
                          f"cpu {r['cpu_experts_per_token']:5.1f} bus {r['bus_experts_per_token']:5.1f} "
                          f"gathered {r['gathered_per_token']:5.1f} /tok  bus {r['h2d_bytes_per_token'] / 1e6:6.1f} MB/tok  "
                          f"busy {r['cpu_busy_share']:.2f}  pred/meas {r['cold_predicted_ms_per_token']:.2f}/"
                          f"{r['cold_measured_ms_per_token']:.2f} ms", flush=True)
                    for name, calls, own, cum in r.get("profile_own_s", [])[:20]:
                        print(f"    {own * 1e6 / r['tokens']:8.1f} us/token own {cum * 1e6 / r['tokens']:8.1f} cum "
                              f"{calls / r['tokens']:6.1f} calls/token  {name}", flush=True)
                    if r["host_trace_us"]:
                        print("    host us: " + " ".join(f"{k} {v:.0f}" for k, v in r["host_trace_us"].items()), flush=True)
                    for t, g in (r["graph_shares"] or {}).items():     # what auto measured for each share it tried
                        tried = " ".join(f"{k}:{1e3 * v:.2f}" for k, v in g["step_s_by_share"].items())
                        size, recording = t.split(" ")
                        print(f"    {size} tokens, {recording}: share {g['share']:.3f} in force; ms a step by share "
                              f"{tried}", flush=True)
                    for t, g in r.get("predicting", {}).items():       # predicting or quiet replays, as measured
                        tried = " ".join(f"{k}:{1e3 * v:.2f}" for k, v in g["step_s"].items())
                        print(f"    {t} tokens: {'predicting' if g['on'] else 'quiet'} replays; ms a step {tried}",
                              flush=True)
                    if args.out:                 # kept row by row: a run cut short keeps what it measured
                        write_result(args.out, result)
        engine.close()
        del engine
        torch.cuda.empty_cache() if device == "cuda" else None
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
