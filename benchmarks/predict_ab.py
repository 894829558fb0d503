"""Replayed decode steps that predict later layers' experts or not, chosen by measured step times,
against prefetch depth 0 and against depth 2 that always predicts where its claims are open.

On a checkpoint (the kit's trained-like one: ``benchmarks/trained_like_checkpoint.py``), per format and
expert pool share, one engine: batch 1 after a 512-token prompt and 8 sequences after 128-token
prompts, each row ``--warmup`` decode tokens then ``--tokens`` timed, for

* ``depth0``: prefetch depth 0 (no predictions);
* ``tuned``: depth 2, each step size replaying whichever recording its measured steps say is faster
  (engine/experts/predict_tuner.py, the default);
* ``predict``: depth 2, replaying the predicting recording whenever the claims are open (the behaviour
  before the tuner);
* ``tuned1``: as ``tuned``, with one CPU share tuner for both recordings (the behaviour before each
  recording had its own: a probe of the other recording ran at the share tuned for the one in force).

    python benchmarks/predict_ab.py --hf /dev/shm/strata-trained-like-L12 --formats bf16,int4 \
        --shares 50,25,0 --out predict_ab.json
    python benchmarks/predict_ab.py --smoke          # a tiny model on the CPU (what the tests run)
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.offload_sweep import Sweep, sampled_decode  # noqa: E402
from engine import LLM  # noqa: E402
from engine.experts.predict_tuner import PredictTuner  # noqa: E402

VARIANTS = ("depth0", "tuned", "predict")


def set_variant(llm: LLM, variant: str) -> None:
    engine = llm.engine
    engine.reconfigure(prefetch_depth=0 if variant == "depth0" else 2)
    experts = engine.loaded.experts
    # never probing: the predicting recording replays whenever the claims are open
    experts.direct.choice.predict_tuner = (PredictTuner(trials=10 ** 9, start=True) if variant == "predict"
                                           else PredictTuner())
    # read where the shares are made (the first recording); where they are made already, set on them
    experts.tuning = dataclasses.replace(experts.tuning, share_per_recording=variant != "tuned1")
    if experts.direct.shares is not None:
        experts.direct.shares.set_per_recording(variant != "tuned1")


def follow_steps(experts) -> tuple[list, Callable[[], None]]:
    """Record every decode step the expert manager observes, warm-up included: [step ms, eager (1/0),
    whether it replayed the predicting recording (1/0/-1: not replayed), the CPU share set for it].
    Returns the list and a function that stops recording."""
    steps: list = []
    observe = experts.observe_step

    def observed(tokens, eager, seconds, recorded=None):
        direct = experts.direct
        share = float(direct.shares.frac.numpy()[0]) if direct.shares is not None and not eager else 0.0
        last = direct.choice.replayed
        replayed = -1 if eager or last is None else int(last)
        steps.append([round(seconds * 1e3, 3), int(bool(eager)), replayed, round(share, 3)])
        return observe(tokens, eager, seconds, recorded)
    own = "observe_step" in vars(experts)          # set on the object itself (else its class's method)
    experts.observe_step = observed

    def stop() -> None:
        if own:
            experts.observe_step = observe
        else:
            del experts.observe_step
    return steps, stop


def trajectory(steps: list, timed: int) -> dict:
    """What the steps ran, in the warm-up and the timed steps' first and second half: mean step ms,
    and the shares of eager, predicting and CPU-share values."""
    def part(rows: list) -> dict:
        if not rows:
            return {}
        shares: dict[str, int] = {}
        for r in rows:
            shares[f"{r[3]:.3f}"] = shares.get(f"{r[3]:.3f}", 0) + 1
        return {"steps": len(rows), "mean_ms": sum(r[0] for r in rows) / len(rows),
                "eager": sum(r[1] for r in rows), "predicting": sum(r[2] == 1 for r in rows), "cpu_shares": shares}
    warm, run = steps[:len(steps) - timed], steps[len(steps) - timed:]
    half = len(run) // 2
    return {"warmup": part(warm), "first_half": part(run[:half]), "second_half": part(run[half:]), "steps": steps}


def measure(llm: LLM, sweep: Sweep, batch: int, prompt: int, seed: int) -> dict:
    vocab = llm.engine.loaded.spec.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, vocab - 10, (batch, prompt), generator=g).tolist()
    steps, stop = follow_steps(llm.engine.loaded.experts)
    try:
        n, secs, before, after, _, _ = sampled_decode(llm.engine, prompts, sweep, seed)
    finally:
        stop()
    d = lambda f: getattr(after, f) - getattr(before, f)   # noqa: E731
    looked = d("hits") + d("misses")
    return {"tokens": n, "tok_s": n / secs, "hit_rate": d("hits") / looked if looked else 1.0,
            "h2d_mb_per_token": d("h2d_bytes") / n / 1e6, "cpu_experts_per_token": d("cpu_experts") / n,
            "predicting": dict(after.predicting), "cpu_shares": dict(after.cpu_shares),
            "trajectory": trajectory(steps, min(len(steps), sweep.tokens))}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", help="checkpoint folder (default with --smoke: a tiny one made here)")
    ap.add_argument("--formats", default="bf16,int4")
    ap.add_argument("--shares", default="50,25,0", help="expert pool shares, percent")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    path = args.hf
    if path is None:
        if not args.smoke:
            ap.error("--hf is required on the GPU")
        import tempfile
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tests.tiny_models import build_tiny_model
        path = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="predict_ab_")), "qwen3_moe"))
    cases = [(1, 32 if args.smoke else 512), (8, 16 if args.smoke else 128)]
    result: dict = {"benchmark": "predict_ab", "what": __doc__.split("\n\n")[0], "hf": path, "tokens": args.tokens,
                    "warmup": args.warmup, "rows": [], "errors": []}
    for fmt in args.formats.split(","):
        for share in args.shares.split(","):
            sweep = Sweep(fmt, (), (), (1, 8), args.tokens, args.warmup, device, "float32", "", None)
            t0 = time.perf_counter()
            try:
                llm = LLM(path, device=device, weight_format=fmt, expert_pool_size=f"{share}%", prefetch_depth=2,
                          max_batch=8, max_model_len=1024, kv_cache_size="256M" if args.smoke else "1G",
                          **({"dtype": "float32", "group_size": 32} if args.smoke else {}))
            except Exception as e:  # noqa: BLE001 - recorded; the next cell runs
                result["errors"].append({"format": fmt, "share": share, "error": "".join(traceback.format_exception(e))[-2000:]})
                print(f"{fmt} {share}%: load failed: {e!r}"[:300], flush=True)
                continue
            load_s = time.perf_counter() - t0
            try:
                for variant in args.variants.split(","):
                    set_variant(llm, variant)
                    for batch, prompt in cases:
                        r = {"format": fmt, "share": float(share), "variant": variant, "batch": batch, "prompt": prompt,
                             "load_s": load_s, **measure(llm, sweep, batch, prompt, seed=batch * 100)}
                        result["rows"].append(r)
                        tr = r["trajectory"]
                        halves = "/".join(f"{tr[h].get('mean_ms', 0):.1f}" for h in ("warmup", "first_half", "second_half"))
                        print(f"{fmt:5} pool {share:>3}% {variant:8} b{batch}: {r['tok_s']:8.1f} tok/s  hit "
                              f"{100 * r['hit_rate']:5.1f}%  bus {r['h2d_mb_per_token']:6.1f} MB/tok  cpu "
                              f"{r['cpu_experts_per_token']:5.1f}/tok  predicting {r['predicting']}  ms a step "
                              f"warm-up/first/second half {halves}", flush=True)
                        if args.out:
                            write_result(args.out, result)
            except Exception as e:  # noqa: BLE001
                result["errors"].append({"format": fmt, "share": share, "error": "".join(traceback.format_exception(e))[-2000:]})
                print(f"{fmt} {share}%: failed: {e!r}"[:300], flush=True)
            finally:
                llm.close()
                del llm
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
    by = {(r["format"], r["share"], r["batch"], r["variant"]): r["tok_s"] for r in result["rows"]}
    print("format share batch | depth0 | tuned | predict | tuned1 | tuned/depth0 tuned/predict tuned/tuned1")
    ratio = lambda a, b: f"{a / b:5.2f}x" if a and b else "    -"   # noqa: E731
    for (fmt, share, batch, variant), v in by.items():
        if variant != "tuned":
            continue
        d0, pr, t1 = (by.get((fmt, share, batch, x)) for x in ("depth0", "predict", "tuned1"))
        print(f"{fmt:5} {share:5.0f}% b{batch} | {d0 or 0:7.1f} | {v:7.1f} | {pr or 0:7.1f} | {t1 or 0:7.1f} | "
              f"{ratio(v, d0)} {ratio(v, pr)} {ratio(v, t1)}")
    if args.out:
        write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
