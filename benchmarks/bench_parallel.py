"""One card against two: pipeline parallel and expert parallel for an offloaded MoE, in one run.

A Qwen3-30B-A3B-shaped random checkpoint (``--layers`` layers) is written to ``--dir`` (the stage
processes read it from there), then for each setting — one card, ``--pipeline-parallel N``,
``--expert-parallel N`` — and batch size, the decode tok/s after a warm-up, with the hit rate, bus
bytes per token and bus GB/s of every card, each card held to ``--budget`` (one GPU's budget;
N cards get N times it):

    python benchmarks/bench_parallel.py --cards 2 --budget 24G --batches 1,16 --out parallel.json

The bus-bound limit of a card is its bus bytes per token over the pinned copy rate measured in the
same run; a pipeline's stages take turns (their limits add up per token), expert parallel's cards
fetch at once. ``--smoke`` runs a tiny shape with CPU processes (what the CI's test of this script
does).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import ROOT, h2d_bandwidth_gbs, write_result  # noqa: E402
from benchmarks.synthetic_moe import QWEN3_30B, SMOKE, base_std, build_hf, sync  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402


def write_model(folder: Path, shape: dict, dtype: torch.dtype) -> None:
    """A random checkpoint with the demo model's tokenizer (the benchmark sends token ids)."""
    if (folder / "config.json").is_file():
        return
    hf, _ = build_hf(shape, dtype, base_std(shape), "cpu")
    hf.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "resources" / "models" / "demo" / name, folder / name)


def decode(llm: LLM, batch: int, prompt_len: int, warmup: int, tokens: int, vocab: int, device: str):
    """Tokens timed, seconds, and the stats before and after the timed steps."""
    engine = llm.engine
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(10, vocab, (batch, prompt_len), generator=gen).tolist()
    made: dict[str, int] = {}
    for i, p in enumerate(prompts):
        rid = engine.add_request(None, p, SamplingParams(max_tokens=warmup + tokens, temperature=1.0, seed=i,
                                                         ignore_eos=True))
        made[rid] = 0

    def step() -> None:
        for d in engine.step():
            made[d.request_id] += len(d.new_token_ids)
    while min(made.values()) < warmup:
        step()
    sync(device)
    before, done = engine.stats(), sum(made.values())
    t0 = time.perf_counter()
    while engine.has_unfinished():
        step()
    sync(device)
    seconds = time.perf_counter() - t0
    return sum(made.values()) - done, seconds, before, engine.stats()


def cards(before, after, n: int, seconds: float, pinned_gbs: float | None) -> list[dict]:
    """Per card: hit rate, bus bytes per token, bus GB/s, memory, over the timed steps."""
    pairs = list(zip(before.stages, after.stages)) or [(before, after)]
    out = []
    for i, (b, a) in enumerate(pairs):
        hits, misses = a.experts.hits - b.experts.hits, a.experts.misses - b.experts.misses
        bus = a.experts.h2d_bytes - b.experts.h2d_bytes
        row = {"card": i, "device": getattr(a, "device", None), "hit_rate": hits / (hits + misses) if hits + misses else 1.0,
               "bus_bytes_per_token": bus / n, "bus_gb_s": bus / seconds / 1e9,
               "memory": {k: getattr(a.memory, k) for k in ("resident_bytes", "expert_pool_bytes", "kv_cache_bytes",
                                                            "workspace_bytes", "budget_bytes", "max_allocated_bytes")}}
        if pinned_gbs and bus:
            row["bus_limit_tok_s"] = pinned_gbs * 1e9 / (bus / n)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cards", type=int, default=2)
    ap.add_argument("--budget", default="24G", help="one card's GPU memory budget")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="one,pipeline,experts")
    ap.add_argument("--format", default="int4")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--dir", default="/dev/shm/strata-parallel")
    ap.add_argument("--smoke", action="store_true", help="tiny shape, CPU processes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = dict(SMOKE) if args.smoke else dict(QWEN3_30B, num_hidden_layers=args.layers)
    device = "cpu" if args.smoke else "cuda"
    folder = Path(args.dir)
    write_model(folder, shape, torch.float32 if args.smoke else torch.bfloat16)
    pinned = None if args.smoke else h2d_bandwidth_gbs("cuda")
    common = dict(device=device, dtype="float32" if args.smoke else "bfloat16", max_batch=max(int(b) for b in args.batches.split(",")),
                  max_model_len=1024, weight_format=args.format if not args.smoke else "auto")
    result: dict = {"benchmark": "parallel" + ("_smoke" if args.smoke else ""), "model": shape, "cards": args.cards,
                    "budget_per_card": args.budget, "format": common["weight_format"], "pinned_h2d_gb_s": pinned,
                    "tokens": args.tokens, "warmup": args.warmup, "rows": [], "errors": []}
    settings = {"one": {}, "pipeline": {"pipeline_parallel": args.cards}, "experts": {"expert_parallel": args.cards}}
    for mode in args.modes.split(","):
        n_cards = 1 if mode == "one" else args.cards
        budget = None if args.smoke else ",".join([args.budget] * n_cards)
        try:
            llm = LLM(str(folder), gpu_memory_budget=budget, **common, **settings[mode])
        except Exception as e:
            result["errors"].append({"mode": mode, "stage": "load", "error": "".join(traceback.format_exception(e))[-3000:]})
            print(f"{mode}: load failed: {e!r}"[:300], flush=True)
            continue
        try:
            for b in (int(x) for x in args.batches.split(",")):
                n, secs, before, after = decode(llm, b, args.prompt_len, args.warmup, args.tokens, shape["vocab_size"],
                                                device)
                row = {"mode": mode, "cards": n_cards, "batch": b, "tokens": n, "tok_s": n / secs,
                       "per_card": cards(before, after, n, secs, pinned)}
                result["rows"].append(row)
                print(f"{mode:8} x{n_cards} b{b:<3}: {row['tok_s']:8.1f} tok/s  " + "  ".join(
                    f"card {c['card']}: hit {c['hit_rate']:.1%} bus {c['bus_gb_s']:.1f} GB/s" for c in row["per_card"]),
                    flush=True)
        except Exception as e:
            result["errors"].append({"mode": mode, "stage": "decode", "error": "".join(traceback.format_exception(e))[-3000:]})
            print(f"{mode}: failed: {e!r}"[:300], flush=True)
        finally:
            llm.engine.close()
    one = {r["batch"]: r["tok_s"] for r in result["rows"] if r["mode"] == "one"}
    for r in result["rows"]:
        if r["mode"] != "one" and r["batch"] in one:
            r["speedup_vs_one_card"] = r["tok_s"] / one[r["batch"]]
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
