"""gpt-oss on one GPU: decode speed against its limits, on random gpt-oss-shaped models built in memory.

    PYTHONUNBUFFERED=1 python benchmarks/bench_gpt_oss.py --out $OUT/gpt_oss_DATE.json   # H200: every cell
    python benchmarks/bench_gpt_oss.py --cells c                      # the ladder alone (or a,b then c)
    python benchmarks/bench_gpt_oss.py --tiny --out /tmp/gpt_oss.json   # CPU, seconds: the pipeline end to end

The models (benchmarks/gpt_oss_shapes.py) have gpt-oss-120b's and gpt-oss-20b's shapes, random
weights and MXFP4 experts written straight into the host store as bytes (no float copy of them
anywhere; the store is page-locked once and shared by the run's engines of one shape);
``--routing`` picks near-uniform (random) and/or trained-like routing, one engine each.
Results go to benchmarks/results/gpt_oss_DATE.json (a fresh name: an existing file is never
overwritten; rewritten after every block, so a run cut short keeps what it measured), with the
environment, the settings, each engine's memory plan and every routing's construction.

Cells (``--cells``):

* a: 20b, every expert resident (under the same budget), batch 1: decode tok/s against the HBM
  roofline, the bytes one token reads (resident weights it uses, k experts per layer, its KV) over
  the measured device copy bandwidth (bytes read + written by a 1 GiB copy).
* b: 120b under ``--budget`` (24G) with the engine's defaults, batch 1, 4 and 16: decode tok/s, hit
  rate, bytes over the bus per token (copies and direct reads), bus GB/s, and the bus-bound limit:
  the pinned host-to-device bandwidth measured in the run over those bytes.
* c: the ladder on 120b at the budget, batch 16 (``--ladder-routing``, default trained-like): one
  engine config per rung, applied live (``reconfigure``), each adding one thing to the last:
  naive synchronous offload (pool 0, prefetch depth 0, copies only, the torch reference MoE, no CUDA
  graphs, each prompt prefilled whole in one step) -> + hot-expert pool (the most the budget holds)
  -> + prefetch depth 2 -> + fused MoE kernels (Triton; with them missing experts are read directly
  from host memory) -> + CUDA graphs -> + chunked prefill (``--ladder-chunk`` tokens per step): the
  article's six rungs, every missing expert over the bus (``cold_experts`` bus); then Strata's own
  seventh, + cold experts on the CPU (``cold_experts`` auto: the host CPU computes the share of the
  missing experts that makes the step fastest). ``article_last_over_first`` is rung 6 over rung 1,
  ``last_over_first`` rung 7 over rung 1. The MoE kernels have no EngineConfig knob: that rung swaps
  the model's MoE function (see ``set_moe_kernels``). Chunked prefill changes prefill steps only, so
  its rung shows in ``prefill_warmup_s`` / ``e2e_tok_s`` and the memory peak rather than in decode
  tok/s.

Every row: ``torch.cuda.max_memory_allocated`` (reset as the row starts) against the budget.
Decoding samples at temperature 1 with fixed seeds; the clock of a row starts once every sequence
has ``--warmup`` tokens (prefill and warm-up are timed apart) and stops when the first one is done,
so ``tok_s`` is decode tok/s over all sequences; ``e2e_tok_s`` counts every token over the whole
run of the row. Prompts are random ids.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import ROOT, h2d_bandwidth_gbs, interval_union, write_result  # noqa: E402
from benchmarks.gpt_oss_shapes import HostRows, ModelOnRows, RandomGptOss, make_routing, model_spec  # noqa: E402
from benchmarks.synthetic_moe import profiled_steps, sync, top_share  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.errors import ConfigError  # noqa: E402
from engine.experts.tuning import ResidencyTuning  # noqa: E402
from engine.loading import expert_layout, resolve_dtype  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.telemetry import ExpertStats  # noqa: E402
from kernels import qlinear  # noqa: E402

ROUTINGS = ("uniform", "trained-like")
LADDER_KNOBS = ("expert_pool_size", "prefetch_depth", "expert_reads", "cuda_graphs", "prefill_chunk",
                "max_batch_tokens", "cold_experts")
ARTICLE_RUNGS = 6                    # the ladder's rungs that the article has; the rest are Strata's own
START = time.perf_counter()


def say(line: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f} s] {line}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Run:
    """Where this run measures: the device, its two ceilings, the host rows its engines share."""

    device: str
    pinned_h2d_gbs: float        # host -> device, page-locked
    device_copy_gbs: float       # bytes read + written per second by a large device copy
    host: HostRows = dataclasses.field(compare=False, repr=False)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def device_copy_gbs(device: str, nbytes: int) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    b = torch.empty_like(a)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        b.copy_(a)
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync()
    return 2 * nbytes * 10 / (time.perf_counter() - t0) / 1e9


def fresh_path(path: Path) -> Path:
    """``path``, or the first of ``stem`` + b, c, ... that does not exist yet."""
    for suffix in ["", *"bcdefghijklmnopqrstuvwxyz"]:
        p = path.with_name(f"{path.stem}{suffix}{path.suffix}")
        if not p.exists():
            return p
    raise FileExistsError(f"{path} and its 25 suffixed names exist; pass --out with a new name")


# ---- engines -------------------------------------------------------------------------------------
def build(shape: str, routing_name: str, args, run: Run, max_batch: int, resident: bool):
    """An engine over a random ``shape`` model with ``routing_name`` routing, and facts about its load.

    The engine before it is collected first (its host store is 61 GB for 120b; engines hold cycles)."""
    gc.collect()
    if run.cuda:
        torch.cuda.empty_cache()
    spec = model_spec(shape)
    options = {"gpu_memory_budget": args.budget} if run.cuda else {}
    if not resident and not run.cuda:          # no budget on the CPU: a pool share stands in for it
        options["expert_pool_size"] = args.cpu_pool
    config = EngineConfig(model=f"gpt-oss-{shape}-shape", device=run.device, dtype=args.dtype, max_batch=max_batch,
                          max_model_len=args.max_model_len, seed=args.seed, resident_weights=args.resident_weights,
                          **options)
    dev = torch.device(run.device)
    dtype = resolve_dtype(config.dtype, dev)
    layout = expert_layout(config, spec, dtype)
    routing = make_routing(routing_name, spec, layout, dev)
    if run.cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    source = RandomGptOss(spec, layout, routing, dev, dtype, args.seed)
    engine = LLMEngine(config, ModelOnRows(run.host.rows(spec, layout), config, spec, source, None))
    if run.cuda:
        torch.cuda.synchronize()
    m = engine.loaded
    facts = {"model": shape, "load_s": time.perf_counter() - t0, "routing": routing.describe(),
             "expert_format": m.layout.fmt, "resident_format": m.resident_format, "expert_bytes": m.layout.nbytes, "params": m.info.params,
             "routed_expert_bytes": m.info.routed_expert_bytes, "experts_resident": m.experts_resident,
             "host_store": run.host.store.describe(),
             "load_peak_gb": torch.cuda.max_memory_allocated() / 1e9 if run.cuda else None,
             "plan": m.plan.format(bus_gb_s=run.pinned_h2d_gbs), "notes": list(m.notes),
             "engine_config": {k: str(v) for k, v in dataclasses.asdict(engine.config).items() if k != "extra"}}
    say(f"built {shape} {routing_name} in {facts['load_s']:.1f} s: {m.layout.fmt} experts, "
        f"{'resident' if m.experts_resident else f'pool {m.plan.pool_slots}/{m.plan.num_experts}'}")
    return engine, facts


def set_moe_kernels(engine: LLMEngine, triton: bool) -> None:
    """The one ladder switch without a config knob: the Triton MoE kernels as chosen at load, or the
    torch reference path (per expert, dequantise and two matmuls)."""
    engine.loaded.model.use_moe_kernels(triton)


# ---- one timed row -------------------------------------------------------------------------------
def prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def _snapshot(engine: LLMEngine, cuda: bool) -> ExpertStats:
    engine.stats()                    # on CUDA a snapshot returns the device counts of the call before
    if cuda:
        torch.cuda.synchronize()
    return engine.stats().experts


def timed_decode(engine: LLMEngine, ps: list[list[int]], warmup: int, tokens: int, seed: int,
                 cuda: bool) -> dict:
    """Sample ``warmup + tokens`` tokens per prompt. The decode clock runs from when every sequence
    has ``warmup`` tokens to when the first one has all: steps in which every sequence decodes (a
    chunked prefill starts them a few steps apart; the tail after the first finish is not timed)."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ids = [engine.add_request(None, p, SamplingParams(max_tokens=warmup + tokens, temperature=1.0, seed=seed + i,
                                                      ignore_eos=True)) for i, p in enumerate(ps)]
    made = dict.fromkeys(ids, 0)

    def step() -> None:
        for d in engine.step():
            made[d.request_id] += len(d.new_token_ids)
    t0 = time.perf_counter()
    while min(made.values()) < warmup:
        step()
    before, done = _snapshot(engine, cuda), sum(made.values())
    t1 = time.perf_counter()
    while max(made.values()) < warmup + tokens:
        step()
    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    timed, after = sum(made.values()) - done, _snapshot(engine, cuda)
    while engine.has_unfinished():
        step()
    if not timed:
        raise RuntimeError(f"no step had every sequence decoding; raise the timed tokens above {tokens}")
    return {"tokens": timed, "decode_s": t2 - t1, "prefill_warmup_s": t1 - t0,
            "e2e_tok_s": sum(made.values()) / (time.perf_counter() - t0), "before": before, "after": after}


def decode_row(engine: LLMEngine, ps: list[list[int]], warmup: int, tokens: int, seed: int, run: Run) -> dict:
    """One timed decode of ``ps`` with the engine's expert counters and memory peak over it."""
    t = timed_decode(engine, ps, warmup, tokens, seed, run.cuda)
    before, after, n, secs = t["before"], t["after"], t["tokens"], t["decode_s"]
    d = lambda f: getattr(after, f) - getattr(before, f)   # noqa: E731
    looked, h2d = d("hits") + d("misses"), d("h2d_bytes") / n
    limit = run.pinned_h2d_gbs * 1e9 / h2d if h2d else None
    row = {"batch": len(ps), "tokens": n, "tok_s": n / secs, "ms_per_step": 1e3 * secs * len(ps) / n,
           "prefill_warmup_s": t["prefill_warmup_s"], "e2e_tok_s": t["e2e_tok_s"],
           "hit_rate": d("hits") / looked if looked else 1.0, "h2d_bytes_per_token": h2d,
           "miss_bytes_per_token": d("misses") * engine.loaded.layout.nbytes / n,
           "direct_bytes_per_token": d("direct_bytes") / n, "prefetch_hits": d("prefetch_hits"),
           "prefetch_wasted": d("prefetch_wasted"),
           "misses_predicted": d("misses_predicted") / d("misses") if d("misses") else None,
           "copy_wait_ms_per_token": d("copy_wait_ms") / n, "bus_gb_s": d("h2d_bytes") / secs / 1e9,
           "bus_limit_tok_s": limit, "fraction_of_bus_limit": n / secs / limit if limit else None,
           "cuda_graphs_active": engine.stats().cuda_graphs_active,
           "cpu_experts_per_token": d("cpu_experts") / n, "cold_experts": engine.config.cold_experts}
    # with cold experts on the CPU the bus alone no longer bounds a step: the combined limit moves each token's
    # missing bytes (over the bus and through the CPU kernels) at the bus's and the CPU kernels' rates together,
    # the CPU's as measured over this run (its experts' bytes / its kernels' time)
    cpu_bytes, cpu_s = d("cpu_experts") * engine.loaded.layout.nbytes, d("cpu_ms") / 1e3
    cpu_gbs = cpu_bytes / cpu_s / 1e9 if cpu_s > 0 else 0.0
    moved = h2d + cpu_bytes / n
    combined = (run.pinned_h2d_gbs + cpu_gbs) * 1e9 / moved if moved else None
    row.update(cpu_bytes_per_token=cpu_bytes / n, cpu_kernel_gb_s=cpu_gbs or None, combined_limit_tok_s=combined,
               fraction_of_combined_limit=n / secs / combined if combined else None)
    budget = engine.loaded.plan.budget_bytes
    if run.cuda and budget is not None:
        peak = torch.cuda.max_memory_allocated()
        row.update(peak_gb=peak / 1e9, budget_gb=budget / 1e9, within_budget=peak <= budget)
    return row


def profile_decode(engine: LLMEngine, vocab: int, args, run: Run, name: str) -> dict:
    """``args.profile`` batch-1 decode steps under torch.profiler after a prompt and a warm-up: the GPU's
    kernels by name per step, its busy time (union of kernel intervals) against the wall time, the host's
    operators by their own time; the trace goes to ``args.trace_dir`` where one is given."""
    from benchmarks.step_profile import _by_name, _kernels
    engine.add_request(None, prompts(vocab, 1, args.prompt_len, 7)[0],
                       SamplingParams(max_tokens=args.warmup + args.profile + 4, temperature=0.0, ignore_eos=True))
    for _ in range(args.warmup + 1):
        engine.step()
    sync(run.device)
    prof, wall_ms = profiled_steps(engine, args.profile, run.device)
    spans = _kernels(prof)
    total, calls = _by_name(spans)
    n = args.profile
    rows = sorted(({"kernel": k[:90], "us_per_step": v / n, "calls_per_step": calls[k] / n}
                   for k, v in total.items()), key=lambda r: -r["us_per_step"])
    host = sorted(((e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()), key=lambda r: -r[1])
    busy = interval_union([(s, e) for s, e, _ in spans]) / n
    if args.trace_dir:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(args.trace_dir) / f"{name}.json"))
    out = {"steps": n, "wall_us_per_step": wall_ms * 1e3, "gpu_busy_us_per_step": busy,
           "kernels_per_step": len(spans) / n, "idle_share": max(0.0, 1 - busy / (wall_ms * 1e3)) if spans else None,
           "kernels": rows[:30], "host_ops": [{"op": k[:90], "self_us_per_step": t / n, "calls_per_step": c / n}
                                              for k, t, c in host[:25]]}
    say(f"profile {name}: {out['wall_us_per_step']:.0f} us a step, GPU busy {busy:.0f} us "
        f"({out['kernels_per_step']:.0f} kernels)")
    for r in rows[:16]:
        say(f"  {r['us_per_step']:8.1f} us x{r['calls_per_step']:5.1f}  {r['kernel']}")
    for r in out["host_ops"][:8]:
        say(f"  host {r['self_us_per_step']:8.1f} us x{r['calls_per_step']:5.1f}  {r['op']}")
    return out


def guarded(fn, args) -> dict:
    """``fn()``'s row, or why there is none (an error or the deadline): one failure never ends the run."""
    if args.deadline and time.perf_counter() - START > args.deadline:
        return {"skipped": f"deadline of {args.deadline} s passed"}
    try:
        return fn()
    except Exception as e:           # keep measuring; the error is in the result file and the table
        return {"error": "".join(traceback.format_exception(e))[-3000:]}


# ---- the cells -----------------------------------------------------------------------------------
def cell_a(args, run: Run, routing: str) -> dict:
    """20b, every expert resident, batch 1, against the HBM roofline (median of ``args.rounds_a``)."""
    engine, facts = build(args.shape_20b, routing, args, run, max_batch=1, resident=True)
    try:
        m, vocab = engine.loaded, engine.loaded.spec.vocab_size
        samples = [guarded(lambda r=r: decode_row(engine, prompts(vocab, 1, args.prompt_len, 10 + r), args.warmup,
                                                  args.tokens, 100 * r, run), args) for r in range(args.rounds_a)]
        good = sorted((s for s in samples if "tok_s" in s), key=lambda s: s["tok_s"])
        if not good:
            return {"cell": "a", "routing": routing, "build": facts, **samples[0]}
        row = dict(good[(len(good) - 1) // 2])
        say(f"20b {routing} batch 1: {row['tok_s']:.1f} tok/s (samples {[round(g['tok_s'], 1) for g in good]})")
        context = args.prompt_len + args.warmup + args.tokens / 2          # mean KV length over the timed steps
        nbytes = m.active_bytes_per_token() + m.plan.kv_bytes_per_token * context
        roof = run.device_copy_gbs * 1e9 / nbytes
        row.update(cell="a", model=args.shape_20b, routing=routing,
                   config="every expert resident" if m.experts_resident else "NOT resident: a pool",
                   samples_tok_s=[s["tok_s"] for s in good], bytes_per_token=nbytes, roofline_tok_s=roof,
                   fraction_of_roofline=row["tok_s"] / roof, build=facts)
        if args.profile:
            row["profile"] = guarded(lambda: profile_decode(engine, vocab, args, run, f"20b-{routing}-b1"), args)
        return row
    finally:
        engine.close()


def ladder_rungs(engine: LLMEngine, args, live: dict) -> list[tuple[str, dict, bool]]:
    """(name, options changed from the rung before, Triton MoE kernels) per rung; options this device
    cannot take (``live``: the engine's live_options) are left out, and the rung says so."""
    whole = {"prefill_chunk": engine.loaded.max_model_len,
             "max_batch_tokens": engine.config.max_batch * engine.loaded.max_model_len}
    rungs = [("naive synchronous offload", {"expert_pool_size": 0, "prefetch_depth": 0, "expert_reads": "copy",
                                            "cuda_graphs": False, "cold_experts": "bus", **whole}, False),
             ("+ hot-expert pool", {"expert_pool_size": engine.loaded.plan.pool_bytes}, False),
             ("+ prefetch depth 2", {"prefetch_depth": 2}, False),
             ("+ fused MoE kernels", {"expert_reads": "auto"}, True),
             ("+ CUDA graphs", {"cuda_graphs": True}, True),
             ("+ chunked prefill", {"prefill_chunk": args.ladder_chunk, "max_batch_tokens": None}, True),
             ("+ cold experts on the CPU", {"cold_experts": "auto"}, True)]
    return [(name, {k: v for k, v in opts.items() if live.get(k) is None}, fused) for name, opts, fused in rungs]


def ladder(engine: LLMEngine, args, run: Run) -> list[dict]:
    """The ladder's rows, in order, on ``engine`` (left as it was loaded afterwards, MoE kernels included)."""
    triton = engine.loaded.model.moe_kernels          # False where the device has no Triton MoE
    live, rows = engine.live_options(), []
    ps = prompts(engine.loaded.spec.vocab_size, engine.config.max_batch, args.ladder_prompt_len, 7)
    try:
        for i, (name, opts, fused) in enumerate(ladder_rungs(engine, args, live)):
            def rung_row(opts=opts, fused=fused, seed=1000 * (i + 1)) -> dict:
                applied = engine.reconfigure(**opts) if opts else {}
                set_moe_kernels(engine, triton and fused)
                row = decode_row(engine, ps, args.ladder_warmup, args.ladder_tokens, seed, run)
                return {**row, "applied": applied}
            row = guarded(rung_row, args)
            row.update(cell="c", rung=i + 1, config=name, moe_kernels="triton" if fused and triton
                       else "torch reference", engine_config={k: getattr(engine.config, k) for k in LADDER_KNOBS},
                       unavailable={k: live[k] for k in LADDER_KNOBS if live.get(k) is not None})
            rows.append(row)
            say(f"ladder rung {i + 1} {name}: {row.get('tok_s', float('nan')):.1f} tok/s")
    finally:
        set_moe_kernels(engine, triton)
    first, last = rows[0].get("tok_s"), rows[-1].get("tok_s")
    if first and last:
        rows[-1]["last_over_first"] = last / first
        article = rows[min(ARTICLE_RUNGS, len(rows)) - 1].get("tok_s")
        rows[-1]["article_last_over_first"] = article / first if article else None
    return rows


def block_120b(args, run: Run, routing: str) -> dict:
    """Cells b (and c, for the ladder's routing) on one 120b engine with ``routing``."""
    engine, facts = build(args.shape_120b, routing, args, run, max_batch=max(args.batches), resident=False)
    try:
        vocab, out = engine.loaded.spec.vocab_size, {"build": facts, "rows": []}
        acts0 = torch.tensor(engine.stats().experts.activations)
        if "b" in args.cells:
            base = engine.loaded.experts.tuning
            for b in args.batches:
                for name, changes in args.variants:     # each batch's variants in turn, on the same engine
                    engine.loaded.experts.tuning = dataclasses.replace(base, **changes)
                    row = guarded(lambda b=b: decode_row(engine, prompts(vocab, b, args.prompt_len, b),
                                                         args.warmup, args.tokens, 10 * b, run), args)
                    config = "defaults" if not changes else name
                    out["rows"].append({"cell": "b", "model": args.shape_120b, "routing": routing, "config": config,
                                        **row, "batch": b})
                    say(f"120b {routing} batch {b} {config}: {row.get('tok_s', float('nan')):.1f} tok/s")
            engine.loaded.experts.tuning = base
            if args.profile:
                out["profile_b1"] = guarded(lambda: profile_decode(engine, vocab, args, run, f"120b-{routing}-b1"),
                                            args)
        if "c" in args.cells and routing == args.ladder_routing:
            out["ladder"] = [{"model": args.shape_120b, "routing": routing, **r} for r in ladder(engine, args, run)]
        acts = torch.tensor(engine.stats().experts.activations) - acts0      # [L, E] routed tokens over the block
        out["engine_top10_share"] = top_share(acts) if acts.numel() else None
        return out
    finally:
        engine.close()


# ---- the report ----------------------------------------------------------------------------------
def all_rows(result: dict) -> list[dict]:
    rows = list(result.get("a", []))
    for routing, block in result.get("120b", {}).items():
        failed = [] if "build" in block else [{"cell": "b/c", "routing": routing, **block}]
        rows += failed + block.get("rows", []) + block.get("ladder", [])
    return rows


def summary(result: dict) -> dict:
    """The issue's targets beside what was measured (None where a figure is missing)."""
    rows = [r for r in all_rows(result) if "tok_s" in r and (r.get("cell") != "b" or r.get("config") == "defaults")]
    roof = [r["fraction_of_roofline"] for r in rows if r.get("cell") == "a"]
    bus = [r["fraction_of_bus_limit"] for r in rows if r.get("cell") == "b" and r.get("fraction_of_bus_limit")]
    combined = [r["fraction_of_combined_limit"] for r in rows
                if r.get("cell") == "b" and r.get("fraction_of_combined_limit")]
    b16 = [r["tok_s"] for r in rows if r.get("cell") == "b" and r["batch"] == 16 and r["routing"] == "trained-like"]
    ladder = [r for r in rows if r.get("cell") == "c"]
    peaks = [r["within_budget"] for r in rows if "within_budget" in r]
    return {"20b_fraction_of_roofline": max(roof, default=None), "target_roofline": 0.5,
            "120b_min_fraction_of_bus_limit": min(bus, default=None), "target_bus": 0.8,
            "120b_min_fraction_of_combined_limit": min(combined, default=None),
            "120b_b16_trained_like_tok_s": b16[0] if b16 else None, "target_b16_tok_s": 108.0,
            "ladder_article_last_over_first": ladder[-1].get("article_last_over_first") if ladder else None,
            "target_ladder": 10.0,        # the article's: its last rung (6) over its first
            "ladder_last_over_first": ladder[-1].get("last_over_first") if ladder else None,
            "every_cell_within_budget": all(peaks) if peaks else None}


def print_table(result: dict) -> None:
    f = lambda r, k, spec, scale=1.0: format(r[k] * scale, spec) if r.get(k) is not None else "-"   # noqa: E731
    print(f"pinned H2D {result['ceilings']['pinned_h2d_gbs']:.1f} GB/s, device copy "
          f"{result['ceilings']['device_copy_gbs']:.0f} GB/s; tok/s decode over all sequences; limit = pinned "
          "H2D / bus bytes per token; x comb = share of the bus + CPU limit; roof = HBM roofline share")
    print(f"{'c':<2}{'model':<10}{'routing':<13}{'B':>3} {'config':<27}{'tok/s':>8}{'hit%':>6}{'MB/tok':>8}"
          f"{'busGB/s':>8}{'limit':>8}{'x lim':>6}{'x comb':>7}{'roof%':>6}{'pf_s':>6}{'peak/budget GB':>15}")
    for r in all_rows(result):
        head = f"{r.get('cell', '?'):<2}{r.get('model', ''):<10}{r.get('routing', ''):<13}{r.get('batch', ''):>3} " \
               f"{r.get('config', '')[:26]:<27}"
        if "tok_s" not in r:
            print(head + ("ERROR " + r["error"].strip().splitlines()[-1] if "error" in r else r.get("skipped", "?")))
            continue
        mem = f"{r['peak_gb']:.1f}/{r['budget_gb']:.1f}" if "peak_gb" in r else "-"
        print(head + f"{r['tok_s']:>8.1f}{f(r, 'hit_rate', '6.1f', 100)}{f(r, 'h2d_bytes_per_token', '8.1f', 1e-6):>8}"
              f"{f(r, 'bus_gb_s', '8.1f'):>8}{f(r, 'bus_limit_tok_s', '8.1f'):>8}"
              f"{f(r, 'fraction_of_bus_limit', '6.2f'):>6}{f(r, 'fraction_of_combined_limit', '7.2f'):>7}"
              f"{f(r, 'fraction_of_roofline', '6.0f', 100):>6}{f(r, 'prefill_warmup_s', '6.1f'):>6}{mem:>15}")
    print("summary: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in result["summary"].items()))


# settings whose default differs with --tiny: (name, default, --tiny default, help)
SIZED = (("tokens", 32, 3, "timed decode tokens per sequence"), ("warmup", 8, 2, "tokens per sequence before timing"),
         ("prompt_len", 64, 12, "prompt tokens"), ("ladder_tokens", 12, 8, "timed tokens per sequence per rung"),
         ("ladder_warmup", 2, 1, "tokens per sequence per rung before timing"),
         ("ladder_prompt_len", 128, 12, "prompt tokens per rung"),
         ("ladder_chunk", 512, 48, "tokens per step of the chunked-prefill rung"),
         ("max_model_len", 1024, 64, "context length of every engine"),
         ("deadline", 540.0, None, "seconds after which the rows left are skipped"))


# the ResidencyTuning fields read at every step (others are read once, when the expert manager is made)
LIVE_TUNING = ("fill_share", "end_late", "prefetch_per_layer")


def tuning_changes(variant: str) -> dict:
    """``"fill_share=0.5:end_late=1"`` -> the ResidencyTuning fields it changes, each as its field's type
    (``"defaults"``: none); only fields read at every step (LIVE_TUNING) can change between rows."""
    fields = {f.name: f for f in dataclasses.fields(ResidencyTuning)}
    changes: dict = {}
    for part in variant.split(":"):
        if part in ("defaults", ""):
            continue
        name, eq, value = part.partition("=")
        if not eq or name not in LIVE_TUNING:
            raise ValueError(f"{part!r} is not NAME=VALUE of a tuning read at every step ({', '.join(LIVE_TUNING)})")
        kind = type(fields[name].default)
        if kind is bool:
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(f"{name}={value!r}: give 1 or 0")
            changes[name] = value.lower() in ("1", "true", "yes")
        else:
            changes[name] = kind(value)
    ResidencyTuning(**changes)            # its own checks of range
    return changes


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="a,b,c", help="any of a (20b resident), b (120b at the budget), c (ladder)")
    ap.add_argument("--routing", default="both", choices=("both", *ROUTINGS))
    ap.add_argument("--ladder-routing", default="trained-like", choices=ROUTINGS)
    ap.add_argument("--budget", default="24G", help="gpu_memory_budget of every engine (CUDA)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--rounds-a", type=int, default=3, help="cell a samples; the row is their median")
    for name, full, small, what in SIZED:
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(full), default=None,
                        help=f"{what} ({full}; --tiny {small})")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--resident-weights", default="auto", help="attention, MLPs and LM head: bf16 | fp8 | int8")
    ap.add_argument("--cpu-pool", default="50%", help="expert pool of the 120b engines on the CPU (no budget there)")
    ap.add_argument("--gemv16", choices=("default", "on", "off"), default="default",
                    help="one-token 16-bit matrices and routers on the GEMV kernel (kernels/qlinear.GEMV16)")
    ap.add_argument("--variants", default="defaults",
                    help="cell b's residency tunings, each batch's in turn on the same engine: comma-separated, "
                         "each 'defaults' or NAME=VALUE[:NAME=VALUE] of engine/experts/tuning.py's fields "
                         "(e.g. defaults,fill_share=0.5,end_late=1)")
    ap.add_argument("--profile", type=int, default=0,
                    help="also profile this many batch-1 decode steps of 20b and of 120b (kernels by name)")
    ap.add_argument("--trace-dir", default=None, help="where the profiled steps' Chrome traces go (default: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU in float32 (a check of the pipeline)")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/gpt_oss_DATE.json; --tiny: "
                                                "none); an existing file is never overwritten")
    args = ap.parse_args(argv)
    for name, full, small, _ in SIZED:
        if getattr(args, name) is None:
            setattr(args, name, small if args.tiny else full)
    if min(args.warmup, args.ladder_warmup) < 1:
        ap.error("--warmup and --ladder-warmup must be at least 1: a sequence's first token comes from its prefill")
    args.cells = set(args.cells.split(","))
    try:
        args.variants = [(v, tuning_changes(v)) for v in args.variants.split(",")]
    except (ValueError, TypeError, ConfigError) as e:
        ap.error(f"--variants: {e}")
    if all(changes for _, changes in args.variants):
        ap.error("--variants: name 'defaults' among them (the summary's targets are the defaults' rows)")
    args.routings = list(ROUTINGS) if args.routing == "both" else [args.routing]
    args.batches = [int(b) for b in args.batches.split(",")]
    args.shape_20b, args.shape_120b = ("tiny-20b", "tiny-120b") if args.tiny else ("20b", "120b")
    if args.tiny and args.dtype == "auto":
        args.dtype = "float32"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.gemv16 != "default":
        qlinear.GEMV16 = args.gemv16 == "on"
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    size = 1 << (24 if args.tiny else 30)
    run = Run(device, h2d_bandwidth_gbs(device, size), device_copy_gbs(device, size), HostRows(torch.device(device)))
    say(f"{device}: pinned H2D {run.pinned_h2d_gbs:.1f} GB/s, device copy {run.device_copy_gbs:.0f} GB/s")
    default = ROOT / "benchmarks" / "results" / f"gpt_oss_{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    out = None if args.tiny and args.out is None else fresh_path(Path(args.out) if args.out else default)
    result: dict = {"benchmark": "bench_gpt_oss", "settings": {k: sorted(v) if isinstance(v, set) else v
                                                                for k, v in vars(args).items()},
                    "ceilings": {"pinned_h2d_gbs": run.pinned_h2d_gbs, "device_copy_gbs": run.device_copy_gbs},
                    "a": [], "120b": {}, "gemv16": qlinear.GEMV16}
    save = lambda: write_result(out, {**result, "summary": summary(result)}) if out else None   # noqa: E731
    if "a" in args.cells:
        for routing in args.routings:
            row = guarded(lambda routing=routing: cell_a(args, run, routing), args)
            result["a"].append({"cell": "a", "model": args.shape_20b, "routing": routing, **row})
            save()
    if args.cells & {"b", "c"}:
        wanted = args.routings if "b" in args.cells else []
        for routing in dict.fromkeys(wanted + ([args.ladder_routing] if "c" in args.cells else [])):
            result["120b"][routing] = guarded(lambda routing=routing: block_120b(args, run, routing), args)
            save()
    run.host.close()
    result["summary"] = summary(result)
    save()
    if out:
        say(f"wrote {out}")
    print_table(result)
    return result


if __name__ == "__main__":
    main()
