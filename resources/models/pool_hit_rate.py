"""Expert-pool hit rates of the demo model on held-out text, from Strata's own residency counters.

    python resources/models/pool_hit_rate.py [--model resources/models/demo] [--tokens 4096] [--json OUT]

Strata on the CPU with a pool of 25% and 50% of all experts (a pool of N slots holds N of the
layers x experts routed experts, across layers), LRU and LFU eviction, no prefetch. The held-out text
(.carry/demo_corpus/test.txt, else demo_heldout.txt) is cut into 256-token windows and each window is
prefilled ONE token per step (prefill_chunk=1), so the pool sees exactly the per-token routing of
decoding that text. The figure is `LLM.stats().experts.hit_rate`: distinct experts needed per layer
call that were already resident, over all layer calls.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo import CORPUS_DIR, DEMO_DIR  # noqa: E402

WINDOW = 256
FRACTIONS = (0.25, 0.5)
POLICIES = ("lru", "lfu")


def heldout_windows(tokenizer, tokens: int) -> list[list[int]]:
    path = CORPUS_DIR / "test.txt"
    if not path.exists():
        path = Path(__file__).resolve().parent / "demo_heldout.txt"
    ids = tokenizer.encode(path.read_text(encoding="utf-8")[: tokens * 8])[:tokens]
    return [ids[i : i + WINDOW] for i in range(0, len(ids) - WINDOW + 1, WINDOW)]


def run(model: Path, policy: str, fraction: float, windows: list[list[int]]) -> dict:
    from engine import LLM
    from engine.sampling import SamplingParams

    probe = LLM(str(model), device="cpu")
    nbytes = probe.engine.loaded.layout.nbytes
    spec = probe.engine.loaded.spec
    total = spec.num_moe_layers * spec.num_experts
    probe.close()
    slots = round(fraction * total)
    llm = LLM(str(model), device="cpu", expert_pool_size=slots * nbytes, expert_policy=policy, prefetch_depth=0,
              prefill_chunk=1, max_batch=1)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for w in windows:
        llm.generate(w, params)
    e = llm.stats().experts
    llm.close()
    return {"policy": policy, "fraction": fraction, "slots": e.pool_slots_total, "experts": total,
            "expert_bytes": nbytes, "hits": e.hits, "misses": e.misses, "hit_rate": round(e.hit_rate, 4),
            "per_layer_hit_rate": [round(r, 4) for r in e.per_layer_hit_rate]}


def main() -> None:
    from engine import LLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEMO_DIR)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    tok = LLM(str(args.model), device="cpu").tokenizer
    windows = heldout_windows(tok, args.tokens)
    print(f"{len(windows)} windows x {WINDOW} tokens of held-out text, one token per step\n", flush=True)
    print("| policy | pool | hits | misses | hit rate | per layer |\n|---|---|---|---|---|---|")
    rows = []
    for policy in POLICIES:
        for fraction in FRACTIONS:
            r = run(args.model, policy, fraction, windows)
            rows.append(r)
            layers = " / ".join(f"{x:.0%}" for x in r["per_layer_hit_rate"])
            print(f"| {policy.upper()} | {r['slots']}/{r['experts']} ({fraction:.0%}) | {r['hits']:,} | {r['misses']:,} | "
                  f"{r['hit_rate']:.1%} | {layers} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"tokens": len(windows) * WINDOW, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
