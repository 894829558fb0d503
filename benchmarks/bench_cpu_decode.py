"""Decode tok/s of a model on the CPU: Strata's engine against transformers, same weights, same process.

    python benchmarks/bench_cpu_decode.py [--model DIR] [--tokens 64] [--out FILE]

Both run greedy decoding of the same prompt at batch 1 in float32, interleaved; the best of --repeats
runs of each counts.
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


def _decode_rate(run, n: int) -> float:
    """(n - 1) decode steps over (time for n tokens - time for 1 token): prefill excluded."""
    t0 = time.perf_counter()
    run(1)
    t1 = time.perf_counter()
    run(n)
    t2 = time.perf_counter()
    return (n - 1) / ((t2 - t1) - (t1 - t0))


def strata_runner(model: str, prompt: list[int]):
    llm = LLM(model, device="cpu", dtype="float32")
    run = lambda k: llm.generate([prompt], SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True))  # noqa: E731
    run(4)
    return run


def transformers_runner(model: str, prompt: list[int]):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])

    def run(k: int):
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, eos_token_id=None, pad_token_id=0)
    run(4)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "resources" / "models" / "demo"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    prompt = list(range(1, 17))
    runners = {"strata": strata_runner(args.model, prompt), "transformers": transformers_runner(args.model, prompt)}
    best = dict.fromkeys(runners, 0.0)
    for _ in range(args.repeats):          # interleaved, so a busy moment of the machine hits both
        for name, run in runners.items():
            best[name] = max(best[name], _decode_rate(run, args.tokens))
    strata, hf = best["strata"], best["transformers"]
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
