"""Decode tok/s of a model on the CPU: Strata's engine against transformers, same weights, same process.

    python benchmarks/bench_cpu_decode.py [--model DIR] [--tokens 64] [--out FILE]

Both run greedy decoding of the same prompt at batch 1 in float32; the best of --repeats runs counts.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import ROOT, write_result  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402


def bench_strata(model: str, prompt: list[int], n: int, repeats: int) -> float:
    llm = LLM(model, device="cpu", dtype="float32")
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    full = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))   # warm-up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.generate([prompt], one)                                         # prefill + first token
        t1 = time.perf_counter()
        llm.generate([prompt], full)
        t2 = time.perf_counter()
        best = max(best, (n - 1) / ((t2 - t1) - (t1 - t0)))
    return best


def bench_transformers(model: str, prompt: list[int], n: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    best = 0.0
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
        for _ in range(repeats):
            t0 = time.perf_counter()
            hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)       # prefill + first token
            t1 = time.perf_counter()
            hf.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
            t2 = time.perf_counter()
            best = max(best, (n - 1) / ((t2 - t1) - (t1 - t0)))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "resources" / "models" / "demo"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    prompt = list(range(1, 17))
    strata = bench_strata(args.model, prompt, args.tokens, args.repeats)
    hf = bench_transformers(args.model, prompt, args.tokens, args.repeats)
    result = {"benchmark": "cpu_decode", "config": {"model": Path(args.model).name, "batch": 1, "dtype": "float32",
                                                    "prompt_tokens": len(prompt), "new_tokens": args.tokens},
              "strata_decode_tok_s": round(strata, 1), "transformers_decode_tok_s": round(hf, 1),
              "ratio": round(strata / hf, 2), "target_ratio": 1.5}
    if args.out:
        write_result(args.out, result)
    print(f"{'system':<14}{'decode tok/s':>14}")
    print(f"{'strata':<14}{strata:>14.1f}\n{'transformers':<14}{hf:>14.1f}\nratio {strata / hf:.2f}x (target >= 1.5x)")


if __name__ == "__main__":
    main()
