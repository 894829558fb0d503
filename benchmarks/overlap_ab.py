"""Decode throughput with and without steps launched ahead of the last one's read-back
(``overlap_steps``), every expert on the GPU: the llama.cpp kit's shape (Qwen3-30B-A3B, 12 layers,
random weights), batch 1 after a 512-token prompt and 8 / 16 sequences after 128-token prompts, as the
kit's Strata rows step them (``add_request`` / ``step`` / ``has_unfinished``, timed from every
sequence's first token to the last one's end, one sync at each end).

    python benchmarks/overlap_ab.py --out benchmarks/results/overlap_ab_DATE.json    # GPU
    python benchmarks/overlap_ab.py --smoke                                          # CPU: a check of the script

Both settings run on one engine (the option is the runner's), alternating, each batch size best of
``--reps``. The host's time between steps is what overlap hides: the table prints each setting's
tok/s and their ratio.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_result  # noqa: E402
from benchmarks.synthetic_moe import kit_model, strata_engine, sync  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402


def decode_run(engine, vocab: int, batch: int, prompt: int, gen: int, seed: int, device: str) -> dict:
    """``batch`` sequences of ``gen`` tokens after ``prompt``-token prompts: decode tok/s (aggregate)."""
    g = torch.Generator().manual_seed(seed)
    made: dict[str, int] = {}
    for i in range(batch):
        ids = torch.randint(0, vocab, (prompt,), generator=g).tolist()
        rid = engine.add_request(None, ids, SamplingParams(max_tokens=gen + 1, temperature=1.0, seed=seed + i,
                                                           ignore_eos=True))
        made[rid] = 0

    def step() -> None:
        for d in engine.step():
            made[d.request_id] = made.get(d.request_id, 0) + len(d.new_token_ids)
    while min(made.values()) < 1:
        step()
    sync(device)
    first = sum(made.values())
    ahead0 = engine.steps_ahead
    t0 = time.perf_counter()
    while engine.has_unfinished():
        step()
    sync(device)
    seconds = time.perf_counter() - t0
    tokens = sum(made.values()) - first
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "steps_ahead": engine.steps_ahead - ahead0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--format", default="int4", help="expert format (the kit's int4 rows: int4)")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="small shape on the CPU: checks the script runs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    hf, cfg, shape, device = kit_model(a.layers, a.smoke)
    batches = [int(b) for b in a.batches.split(",")]
    engine, load_s = strata_engine(hf, cfg, a.format, max(batches), "auto" if not a.smoke else "float32", device,
                                   kv_cache_size="4G" if not a.smoke else "64M")
    del hf
    vocab = shape["vocab_size"]
    gen = 8 if a.smoke else a.gen
    rows = []
    try:
        for b in batches:
            prompt = (512 if b == 1 else 128) if not a.smoke else 16
            decode_run(engine, vocab, b, prompt, min(gen, 16), 0, device)           # graphs captured, kernels warm
            best: dict[bool, dict] = {}
            for rep in range(a.reps):
                for overlap in (True, False):
                    engine.runner.overlap = overlap
                    got = decode_run(engine, vocab, b, prompt, gen, 100 + rep, device)
                    if overlap not in best or got["tok_s"] > best[overlap]["tok_s"]:
                        best[overlap] = got
            row = {"batch": b, "prompt": prompt, "gen": gen, "on": best[True], "off": best[False],
                   "ratio": best[True]["tok_s"] / best[False]["tok_s"]}
            rows.append(row)
            print(f"batch {b:2}: overlap {best[True]['tok_s']:8.1f} tok/s ({best[True]['steps_ahead']} steps ahead) | "
                  f"off {best[False]['tok_s']:8.1f} tok/s | {row['ratio']:.3f}x", flush=True)
    finally:
        engine.runner.overlap = True
        engine.close()
    if a.out:
        write_result(a.out, {"benchmark": "overlap_ab", "what": (
            "Decode tok/s with decode steps launched ahead of the last one's read-back (overlap_steps) and without, "
            f"on one engine: Qwen3-30B-A3B shape, {a.layers} layers, random weights, {a.format} experts, every "
            "expert on the GPU; batch 1 after a 512-token prompt, 8 and 16 sequences after 128-token prompts; "
            f"best of {a.reps} runs each"), "config": vars(a), "load_s": load_s, "rows": rows})


if __name__ == "__main__":
    main()
