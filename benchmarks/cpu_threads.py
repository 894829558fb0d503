"""Decode tok/s and TTFT on the CPU at 1, 2, ... intra-op threads, with and without busy loops on the other cores.

    python benchmarks/cpu_threads.py [--out FILE] [--budget-s 60]

Models: the bundled demo, and random Qwen3-MoE models built in memory that read more bytes per
token (to see where more threads start to pay). "busy_loops" runs one busy-loop process per core but
one (the outside load the engine meets on a shared machine); "no_added_load" adds none, and the
machine's own 1-minute load average before each is recorded beside it. Each cell is the median of --repeats
greedy requests (16-token prompt, --tokens new tokens), the thread counts interleaved: TTFT is the
time to the first token, decode the rate of the tokens after it. Once --budget-s seconds have
passed each cell stops at the runs it has (at least one) and no further model starts, so the run
stays within about two minutes even on a slow or very busy machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import ROOT, write_result  # noqa: E402
from engine import SamplingParams  # noqa: E402
from engine.checkpoint.memory import DictSource  # noqa: E402
from engine.checkpoint.plan import tensor_plan  # noqa: E402
from engine.checkpoint.spec import spec_from_config  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.cpu_threads import available_cores, choose_cpu_threads  # noqa: E402
from engine.engine import LLMEngine  # noqa: E402
from engine.loading import LoadedModel  # noqa: E402

DEMO = ROOT / "resources" / "models" / "demo"
PROMPT = list(range(1, 17))
# random models reading ~60 MiB and ~200 MiB of fp32 weights per token (the demo: ~5 MiB); --wide picks
WIDE = {"mid": dict(hidden_size=512, moe_intermediate_size=512, num_hidden_layers=6),
        "big": dict(hidden_size=1024, moe_intermediate_size=1024, num_hidden_layers=6)}


def random_engine(shape: dict) -> LLMEngine:
    cfg = dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=4096, intermediate_size=1024,
               num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_experts=8, num_experts_per_tok=2,
               norm_topk_prob=True, max_position_embeddings=512, tie_word_embeddings=True, **shape)
    spec = spec_from_config(cfg, Path("in-memory"))
    gen = torch.Generator().manual_seed(0)
    tensors = {t.name: torch.ones(t.shape) if "norm" in t.name else 0.02 * torch.randn(t.shape, generator=gen)
               for t in tensor_plan(spec)}
    config = EngineConfig(model="in-memory", device="cpu", dtype="float32", max_model_len=256, cpu_threads=1)
    return LLMEngine(config, LoadedModel(config, spec, DictSource(tensors), None))


def demo_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(DEMO), device="cpu", dtype="float32", cpu_threads=1))


def _run(engine: LLMEngine, tokens: int) -> tuple[float, float]:
    """Seconds to the first token, and seconds per token after it."""
    t0 = time.perf_counter()
    engine.add_request(None, PROMPT, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    first = None
    while engine.has_unfinished():
        engine.step()
        first = first or time.perf_counter()
    t1 = time.perf_counter()
    return first - t0, (t1 - first) / max(1, tokens - 1)


def measure(engine: LLMEngine, thread_counts: list[int], tokens: int, repeats: int, deadline: float) -> list[dict]:
    """Median TTFT and decode rate per thread count, the counts interleaved so a busy moment hits all."""
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in thread_counts}
    for n in thread_counts:                                   # warm-up at every count
        torch.set_num_threads(n)
        _run(engine, 1)
    for _ in range(repeats):
        for n in thread_counts:
            if time.perf_counter() > deadline and runs[n]:
                continue
            torch.set_num_threads(n)
            runs[n].append(_run(engine, tokens))
    return [{"threads": n, "runs": len(r), "ttft_ms": round(1e3 * statistics.median(t for t, _ in r), 2),
             "decode_tok_s": round(1.0 / statistics.median(d for _, d in r), 1)} for n, r in runs.items()]


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown")


def start_load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--wide", nargs="*", default=["big"], choices=sorted(WIDE), help="random models besides the demo")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cores = available_cores()
    thread_counts = sorted({1, 2, max(1, cores // 2), max(1, cores - 1), cores})
    deadline = time.perf_counter() + args.budget_s
    models = {"demo": demo_engine, **{k: (lambda s=WIDE[k]: random_engine(s)) for k in args.wide}}
    rows = []
    start = time.perf_counter()
    for name, build in models.items():
        if time.perf_counter() > deadline:
            break                                             # the time is spent: no further model
        engine = build()
        active = engine.loaded.active_bytes_per_token()
        common = {"model": name, "active_mib_per_token": round(active / 2**20, 2)}
        for load in ("no_added_load", "busy_loops"):
            before = os.getloadavg()[0]          # the machine's own load (other users) before this cell
            procs = start_load(cores - 1) if load == "busy_loops" else []
            try:
                for row in measure(engine, thread_counts, args.tokens, args.repeats, deadline):
                    rows.append({**common, "load": load, "loadavg_1min_before": round(before, 2), **row})
                    print(rows[-1], flush=True)
            finally:
                stop_load(procs)
        rows.append({**common, "engine_choice_threads": choose_cpu_threads(active, cores)})
        engine.close()
    result = {"benchmark": "cpu_threads", "cores": cores, "cpu_model": cpu_model(), "busy_loop_processes": cores - 1,
              "config": {"dtype": "float32", "prompt_tokens": len(PROMPT), "new_tokens": args.tokens,
                         "repeats": args.repeats, "statistic": "median", "budget_s": args.budget_s},
              "rows": rows, "wall_s": round(time.perf_counter() - start, 1)}
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
