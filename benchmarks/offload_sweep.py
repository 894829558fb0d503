"""The expert-offload sweep of the end-to-end benchmark: one engine per routing, retuned live.

Each routing gets one engine over the synthetic model's weights, retuned between rows (expert pool
share x prefetch depth x batch). Decoding samples at temperature 1.0 with fixed seeds, so tokens and
routing change every step. The 100% pool row of a batch is the compute-only time per token C.
Per row: tok/s, hit rate, prefetch hits/wasted, H2D bytes per token, bus utilisation (H2D bytes
over decode wall time: the engine does not time its copies), copy_wait_ms per token (compute
stalled on copies), the bus limit M = H2D bytes per token / pinned H2D bandwidth (measured in the
same run), C + M (copies not overlapped) and max(C, M) (perfectly overlapped), the ideal depth>0
speed-up over depth 0, (C + M0) / max(C, M0), and the peak of torch.cuda.max_memory_allocated
above what was allocated before the engine, against the gpu_memory_budget passed to it.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import time
import traceback
from pathlib import Path

import torch

from benchmarks.synthetic_moe import (TrainedLike, make_trained_like, routing_profile, strata_engine, sync,
                                      top_share)
from engine.checkpoint.spec import spec_from_config
from engine.engine import LLMEngine
from engine.experts.tuning import ResidencyTuning
from kernels.expert_layout import ExpertLayout
from engine.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The offload grid and how each row is measured."""

    fmt: str
    pools: tuple[float, ...]         # shares of all routed experts held in the GPU pool
    depths: tuple[int, ...]
    batches: tuple[int, ...]
    tokens: int                      # timed decode tokens per sequence
    warmup: int                      # decode tokens per sequence before the clock starts
    device: str
    dtype: str
    kv_cache_size: str
    budget: int | None               # gpu_memory_budget passed to the engine (None on the CPU)
    repeat: int = 1                  # rounds over the grid; a row reports its median round
    reads: tuple[str, ...] = ("auto",)   # expert_reads of the depth > 0 rows ("copy" rows: the ablation)
    claims: tuple[int | None, ...] = (None,)   # most GPU-side prefetch claims per layer (None: the engine's)
    predict: tuple[str, ...] = ("kernel",)     # depth > 0 decode predictions: one kernel, or matmul + routing
    votes: tuple[str, ...] = ("off",)          # GPU-side claims gated by votes ("gate") or not ("off")
    policies: tuple[str, ...] = ("adaptive",)     # eviction policies, each over the whole grid of a round


def sampled_decode(engine: LLMEngine, prompts: list[list[int]], sweep: Sweep, seed: int, around=None):
    """Sample (temperature 1, seeded) ``warmup + tokens`` tokens per prompt; time only the last
    ``tokens`` steps (``around(run)``, where given, runs them: a profiler). Returns (tokens timed,
    seconds, expert stats before, after, host ms blocked on routing reads, host ms ending steps)."""
    ids = [engine.add_request(None, p, SamplingParams(max_tokens=sweep.warmup + sweep.tokens, temperature=1.0,
                                                      seed=seed + i, ignore_eos=True)) for i, p in enumerate(prompts)]
    made = dict.fromkeys(ids, 0)

    def step() -> None:
        for d in engine.step():
            made[d.request_id] += len(d.new_token_ids)

    def snapshot():
        engine.stats()                  # on CUDA a snapshot returns the device counts of the call before
        sync(sweep.device)
        return engine.stats().experts
    while min(made.values()) < sweep.warmup:
        step()
    before, done = snapshot(), sum(made.values())
    counters = engine.loaded.experts.counters          # host milliseconds waiting for ids, ending steps
    sync0, end0 = counters.sync_ms, counters.step_end_ms
    def timed() -> None:
        while engine.has_unfinished():
            step()
        sync(sweep.device)
    t0 = time.perf_counter()
    (around or (lambda run: run()))(timed)
    seconds = time.perf_counter() - t0
    after = snapshot()
    return (sum(made.values()) - done, seconds, before, after, counters.sync_ms - sync0,
            counters.step_end_ms - end0)


def _row(routing: str, pool: float, depth: int, reads: str, batch: int, timed, base_bytes: int,
         budget: int | None, direct: bool, claims: int | None, expert_bytes: int, predict: str,
         votes: str = "off") -> dict:
    n, secs, before, after, host_wait, step_end = timed
    d = lambda f: getattr(after, f) - getattr(before, f)   # noqa: E731
    looked = d("hits") + d("misses")
    row = {"routing": routing, "pool_fraction": pool, "depth": depth, "reads": reads, "direct_reads": direct,
           "batch": batch, "tokens": n,
           "tok_s": n / secs, "ms_per_token": 1e3 * secs / n, "hit_rate": d("hits") / looked if looked else 1.0,
           "prefetch_hits": d("prefetch_hits"), "prefetch_wasted": d("prefetch_wasted"),
           "h2d_bytes_per_token": d("h2d_bytes") / n, "bus_gb_s": d("h2d_bytes") / secs / 1e9,
           "direct_bytes_per_token": d("direct_bytes") / n, "fills": d("fills"),
           # misses (each layer's distinct missing experts) against the (token, expert) pairs read directly
           "misses_per_token": d("misses") / n, "direct_reads_per_token": d("direct_bytes") / expert_bytes / n,
           "claims_per_layer": claims, "predict": predict, "claim_votes": votes,
           # share of the misses that a prediction for their layer had named (what prefetch could hide)
           "misses_predicted": d("misses_predicted") / d("misses") if d("misses") else None,
           "copy_wait_ms_per_token": d("copy_wait_ms") / n,
           # wall time the host spent blocked on routing reads (GPU busy); the rest is host work
           "host_wait_ms_per_token": host_wait / n,
           # host time ending steps (counting, admissions), partly while the GPU samples
           "step_end_ms_per_token": step_end / n}
    if torch.cuda.is_available() and budget is not None:
        peak = torch.cuda.max_memory_allocated()
        row.update(peak_allocated_gb=peak / 1e9, engine_peak_gb=(peak - base_bytes) / 1e9, budget_gb=budget / 1e9,
                   within_budget=peak - base_bytes <= budget)
    return row


def offload_block(hf, cfg, sweep: Sweep, prompts: dict, routing: str) -> dict:
    """One engine over ``hf``'s weights, retuned live for each (pool, depth), every batch size decoded."""
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}, Path("in-memory"))
    expert = ExpertLayout.make(sweep.fmt, spec.hidden, spec.moe_ffn, 128).nbytes
    total = expert * spec.num_moe_layers * spec.num_experts
    cuda = sweep.device.startswith("cuda")
    # what is not the engine's: what was allocated before it (transformers' model shares the GPU)
    if cuda:
        gc.collect()                       # tensors left from building the routing are not the engine's
        torch.cuda.synchronize()
    base = torch.cuda.memory_allocated() if cuda else 0
    budget = {} if sweep.budget is None else {"gpu_memory_budget": sweep.budget}
    engine, load_s = strata_engine(hf, cfg, sweep.fmt, max(sweep.batches), sweep.dtype, sweep.device,
                                   sweep.kv_cache_size, expert_pool_size=int(total * sweep.pools[0]),
                                   prefetch_depth=sweep.depths[0], **budget)
    rows = []
    try:
        for _ in range(sweep.repeat):      # rounds: a slow spell of the host hits every setting alike
            for policy, (pool, depth, reads, claims, predict, votes, b) in itertools.product(sweep.policies,
                                                                                            _settings(sweep)):
                engine.reconfigure(expert_policy=policy)
                rows.append(_timed_row(engine, sweep, routing, pool, depth, reads, claims, predict, votes, b,
                                       prompts[b], total, base, expert, len(rows)))
        rows = _medians(rows)
        acts = torch.tensor(engine.stats().experts.activations)                        # [L, E]
        plan_budget = engine.loaded.plan.budget_bytes
    finally:
        engine.close()
    return {"rows": rows, "engine_top10_share": top_share(acts), "load_s": load_s, "expert_bytes": expert,
            "gpu_memory_budget": sweep.budget, "engine_plan_budget": plan_budget}


def _settings(sweep: Sweep) -> list[tuple]:
    """(pool, depth, reads, claims, predict, votes, batch) of every row of one round; a full pool never
    prefetches, and the depth > 0 knobs apply only below it."""
    out = []
    for pool in sweep.pools:
        for depth in sweep.depths if pool < 1 else sweep.depths[:1]:
            knobs = itertools.product(sweep.reads, sweep.claims, sweep.predict, sweep.votes) \
                if depth > 0 and pool < 1 else [("auto", None, "kernel", "off")]
            out += [(pool, depth, *k, b) for k in knobs for b in sweep.batches]
    return out


def _timed_row(engine: LLMEngine, sweep: Sweep, routing: str, pool: float, depth: int, reads: str,
               claims: int | None, predict: str, votes: str, b: int, prompts: list[list[int]], total: int, base: int,
               expert: int, seed: int) -> dict:
    """Retune ``engine`` live to one setting and time a batch-``b`` decode."""
    if sweep.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    engine.reconfigure(expert_pool_size=int(total * pool), prefetch_depth=depth, expert_reads=reads)
    experts = engine.loaded.experts                 # re-recorded graphs follow the settings below
    default = ResidencyTuning().prefetch_per_layer
    experts.tuning = dataclasses.replace(experts.tuning, prefetch_per_layer=default if claims is None else claims)
    experts.predictor.use_kernel = predict == "kernel"
    experts.claims.by_votes = votes == "gate"
    timed = sampled_decode(engine, prompts, sweep, seed=1000 * seed)
    row = _row(routing, pool, depth, reads, b, timed, base, sweep.budget, experts.direct_for(b), claims, expert,
               predict, votes)
    row["policy"] = experts.policy.name
    row["claim_rank_use"] = experts.claims.snapshot()
    row["claim_vote_use"] = experts.claims.vote_snapshot()   # by votes 1, 2, ... per step-size bucket
    return row


def _medians(rows: list[dict]) -> list[dict]:
    """One row per setting: its median round by time per token, with every round's tok/s; the
    memory peak is the largest of any round."""
    out = []
    setting = lambda r: (r["pool_fraction"], r["depth"], r["reads"], r["claims_per_layer"], r["predict"],  # noqa: E731
                         r.get("claim_votes"), r["batch"], r.get("policy"))
    for key in dict.fromkeys(setting(r) for r in rows):
        mine = sorted((r for r in rows if setting(r) == key),
                      key=lambda r: r["ms_per_token"])
        row = dict(mine[(len(mine) - 1) // 2])
        row["rounds_tok_s"] = [r["tok_s"] for r in mine]
        if "engine_peak_gb" in row:
            row["engine_peak_gb"] = max(r["engine_peak_gb"] for r in mine)
            row["within_budget"] = all(r["within_budget"] for r in mine)
        out.append(row)
    return out


def add_limits(rows: list[dict], pinned_gbs: float) -> None:
    """Each row against its physical limits (see the module docstring); ms are per generated token."""
    compute = {(r["routing"], r["batch"]): r["ms_per_token"] for r in rows if r["pool_fraction"] >= 1}
    depth0 = {(r["routing"], r["pool_fraction"], r["batch"], r.get("policy")): r for r in rows if r["depth"] == 0}
    bus_ms = lambda r: r["h2d_bytes_per_token"] / pinned_gbs / 1e6   # noqa: E731
    for r in rows:
        r["bus_limit_ms"], r["bus_fraction_of_pinned"] = bus_ms(r), r["bus_gb_s"] / pinned_gbs
        c = compute.get((r["routing"], r["batch"]))
        if c is None:
            continue
        m = bus_ms(r)
        r.update(compute_ms=c, serial_limit_ms=c + m, overlap_limit_ms=max(c, m),
                 fraction_of_overlap_limit=max(c, m) / r["ms_per_token"])
        if r["depth"] == 0 and r["h2d_bytes_per_token"] and r["ms_per_token"] > c:
            # copies and compute do not overlap at depth 0: the time above C is the copies'
            r["serial_copy_gb_s"] = r["h2d_bytes_per_token"] / (r["ms_per_token"] - c) / 1e6
        z = depth0.get((r["routing"], r["pool_fraction"], r["batch"], r.get("policy")))
        if r["depth"] > 0 and z is not None and r["pool_fraction"] < 1:
            m0 = bus_ms(z)
            r["speedup_vs_depth0"] = z["ms_per_token"] / r["ms_per_token"]
            r["ideal_speedup_vs_depth0"] = (c + m0) / max(c, m0)


def summarise(rows: list[dict], pinned_gbs: float) -> list[dict]:
    """Per (routing, batch): the issue's three targets next to their limits."""
    out = []
    for key in dict.fromkeys((r["routing"], r["batch"], r.get("policy")) for r in rows):
        mine = [r for r in rows if (r["routing"], r["batch"], r.get("policy")) == key]
        pick = lambda pool, depth, reads="auto": next((r for r in mine if r["pool_fraction"] == pool  # noqa: E731
                                                       and r["depth"] == depth and r["reads"] == reads), None)
        s: dict = {"routing": key[0], "batch": key[1], "pinned_gb_s": pinned_gbs}
        if key[2] is not None:
            s["policy"] = key[2]
        d0, d2, d2c = pick(0.5, 0), pick(0.5, 2), pick(0.5, 2, "copy")
        if d0 and d2:
            s.update(pool50_depth2_over_depth0=d0["ms_per_token"] / d2["ms_per_token"],
                     pool50_depth2_direct_reads=d2["direct_reads"], pool50_ideal=d2.get("ideal_speedup_vs_depth0"))
            variants = {f"claims {r['claims_per_layer']}, predict {r['predict']}, votes {r.get('claim_votes')}":
                        d0["ms_per_token"] / r["ms_per_token"]
                        for r in mine if r["pool_fraction"] == 0.5 and r["depth"] == 2 and r["reads"] == "auto"}
            if len(variants) > 1:
                s["pool50_depth2_over_depth0_by_variant"] = variants
        if d0 and d2c:
            s["pool50_depth2_copy_over_depth0"] = d0["ms_per_token"] / d2c["ms_per_token"]
        empty = [r for r in mine if r["pool_fraction"] == 0]
        if empty:
            s["pool0_bus_gb_s"] = max(r["bus_gb_s"] for r in empty)
            s["pool0_serial_copy_gb_s"] = max((r.get("serial_copy_gb_s", 0.0) for r in empty), default=0.0)
            s["pool0_bus_fraction_of_pinned"] = s["pool0_bus_gb_s"] / pinned_gbs
            s["pool0_serial_copy_fraction_of_pinned"] = s["pool0_serial_copy_gb_s"] / pinned_gbs
        if any("within_budget" in r for r in mine):
            s["max_engine_peak_gb"] = max(r["engine_peak_gb"] for r in mine)
            s["within_budget"] = all(r["within_budget"] for r in mine)
        out.append(s)
    return out


def offload_sweep(hf, cfg, sweep: Sweep, routings: list[str], knobs: TrainedLike, prompts: dict, std: float) -> dict:
    """The offload blocks, uniform first: the trained-like reshaping changes ``hf`` in place."""
    calib = torch.randint(10, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(2)).to(hf.device)
    blocks: dict = {}
    for routing in [r for r in ("uniform", "trained-like") if r in routings]:
        try:
            block = {"construction": make_trained_like(hf, std, knobs, calib)} if routing == "trained-like" else {}
            block["measured_hf"] = routing_profile(hf, calib)
            block.update(offload_block(hf, cfg, sweep, prompts, routing))
        except Exception as e:   # keep measuring; the error is in the result file
            block = {"error": "".join(traceback.format_exception(e))[-3000:]}
        blocks[routing] = block
        if sweep.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return blocks
