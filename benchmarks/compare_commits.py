"""One result file from two commits measured in one run: a baseline and a change, each with the
end-to-end benchmark's fully resident rows (``e2e.json``), its residency rows (``residency.json``)
and optionally the greedy tokens of benchmarks/greedy_tokens.py (``tokens.json``).

    python3 benchmarks/compare_commits.py BEFORE_DIR AFTER_DIR --out benchmarks/results/X.json \\
        --what "..." --limit "..."

Prints a short table: decode tok/s per row, after / before, and per token of a direct-read step the
host's own milliseconds (the step's time less its waits for the GPU's ids), those waits, and the time
spent ending steps.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _load(d: Path, name: str) -> dict | None:
    p = d / name
    return json.loads(p.read_text()) if p.exists() else None


def rows(e2e: dict | None, residency: dict | None) -> dict[str, dict]:
    """Row name -> its measured fields."""
    out: dict[str, dict] = {}
    for r in (e2e or {}).get("results", []):
        if r["system"].startswith("strata"):
            out[f"{r['system'].removeprefix('strata ')} resident b{r['batch']}"] = {"tok_s": r["tok_s"]}
    for routing, block in (residency or {}).get("offload", {}).items():
        for r in block.get("rows", []):
            name = f"{int(r['pool_fraction'] * 100)}% pool {routing} depth {r['depth']} b{r['batch']}"
            wait = r.get("host_wait_ms_per_token")
            # the host's own time per token: what it does not spend waiting for the GPU's ids
            busy = None if wait is None else r["ms_per_token"] - wait
            out[name] = {"tok_s": r["tok_s"], "host_wait_ms": wait, "host_busy_ms": busy,
                         "step_end_ms": r.get("step_end_ms_per_token")}
    return out


def compare(before: Path, after: Path) -> dict:
    b = {k: _load(before, f"{k}.json") for k in ("e2e", "residency", "tokens")}
    a = {k: _load(after, f"{k}.json") for k in ("e2e", "residency", "tokens")}
    rb, ra = rows(b["e2e"], b["residency"]), rows(a["e2e"], a["residency"])
    summary = []
    for name in [n for n in ra if n in rb]:
        row = {"row": name, "before_tok_s": rb[name]["tok_s"], "after_tok_s": ra[name]["tok_s"],
               "ratio": ra[name]["tok_s"] / rb[name]["tok_s"]}
        for k in ("host_wait_ms", "host_busy_ms", "step_end_ms"):
            if ra[name].get(k) is not None:
                row[f"before_{k}"], row[f"after_{k}"] = rb[name][k], ra[name][k]
        summary.append(row)
    greedy = None
    if b["tokens"] is not None and a["tokens"] is not None:
        greedy = {k: a["tokens"].get(k) == v for k, v in b["tokens"].items()}
    return {"runs": {"before": {k: v for k, v in b.items() if v is not None},
                     "after": {k: v for k, v in a.items() if v is not None}},
            "greedy_identical": greedy, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--what", default="a change against its baseline commit, measured in one run")
    ap.add_argument("--limit", default="decode tok/s within 3% of the baseline")
    args = ap.parse_args()
    result = compare(args.before, args.after)
    env = lambda run: next((v["environment"] for v in run.values() if isinstance(v, dict) and "environment" in v), {})
    eb, ea = env(result["runs"]["before"]), env(result["runs"]["after"])
    doc = {"benchmark": "commit against its baseline", "what": args.what, "baseline_commit": eb.get("commit"),
           "commit": ea.get("commit"), "limit": args.limit, "environment": ea, **result}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'row':44} {'before':>9} {'after':>9} {'ratio':>6}  host ms/token before/after: busy, wait, step end")
    for r in result["summary"]:
        extra = ""
        if "after_host_wait_ms" in r:
            extra = "  " + ", ".join(f"{r[f'before_{k}']:.2f}/{r[f'after_{k}']:.2f}"
                                     for k in ("host_busy_ms", "host_wait_ms", "step_end_ms"))
        print(f"{r['row']:44} {r['before_tok_s']:9.1f} {r['after_tok_s']:9.1f} {r['ratio']:6.3f}{extra}")
    print("greedy identical:", result["greedy_identical"])


if __name__ == "__main__":
    main()
