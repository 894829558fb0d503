"""Quantisation quality of the demo model, measured with Strata's own converter and evaluator.

    python resources/models/quant_eval.py [--max-tokens 32768] [--json OUT]

For each format: `main.py convert resources/models/demo /tmp/strata_demo_<fmt> --weights ... [--group-size G]`
then `main.py eval --model /tmp/strata_demo_<fmt> --reference resources/models/demo --text TEST
--max-tokens N --window 256 --device cpu --json`, and prints the perplexity deltas against bf16 with the
issue's targets (fp8 within +1%, int4 within +5%). TEST is .carry/demo_corpus/test.txt (held out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST = REPO / ".carry" / "demo_corpus" / "test.txt"
FORMATS = [("fp8", None, 1.0), ("int4", 128, 5.0), ("int4", 64, 5.0), ("int4", 32, 5.0)]  # (weights, group, target %)


def main_py(*argv: str) -> str:
    done = subprocess.run([sys.executable, "main.py", *argv], cwd=REPO, check=True, capture_output=True, text=True)
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resources/models/demo")
    parser.add_argument("--text", type=Path, default=TEST)
    parser.add_argument("--max-tokens", type=int, default=32768)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print("| routed experts | perplexity | vs bf16 | target | top-1 agreement with bf16 | mean logit cosine |\n"
          "|---|---|---|---|---|---|", flush=True)
    rows = []
    for weights, group, target in FORMATS:
        name = weights if group is None else f"{weights}_g{group}"
        dst = f"/tmp/strata_demo_{name}"
        main_py("convert", args.model, dst, "--weights", weights, *(["--group-size", str(group)] if group else []), "--force")
        r = json.loads(main_py("eval", "--model", dst, "--reference", args.model, "--text", str(args.text),
                               "--max-tokens", str(args.max_tokens), "--window", "256", "--device", "cpu",
                               "--json").strip().splitlines()[-1])
        delta = 100 * (r["perplexity"] / r["reference_perplexity"] - 1)
        if not rows:
            print(f"| bf16 | {r['reference_perplexity']:.3f} | | | | |  ({r['tokens']:,} scored tokens)", flush=True)
        label = weights if group is None else f"{weights}, group {group}"
        print(f"| {label} | {r['perplexity']:.3f} | {delta:+.2f}% | within +{target:g}%: "
              f"{'met' if delta <= target else 'missed'} | {100 * r['top1_agreement']:.1f}% | {r['mean_cosine']:.4f} |",
              flush=True)
        rows.append({"weights": weights, "group_size": group, "delta_pct": round(delta, 3), **r})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
