"""Regenerate the README's results section from benchmarks/results/*.json.

    python benchmarks/report.py          # rewrites the block between the RESULTS markers in README.md

Each figure appears with the limit it is measured against, as the result files record it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BEGIN, END = "<!-- RESULTS:BEGIN -->", "<!-- RESULTS:END -->"


def _load(name: str) -> dict | None:
    files = sorted(RESULTS.glob(name))
    return json.loads(files[-1].read_text()) if files else None


def e2e_table(d: dict) -> list[str]:
    out = [f"End to end, Qwen3-30B-A3B shape on an H200 (`{_file('e2e_*.json')}`; {d['routing']}; copy ceiling "
           f"{d['copy_ceiling_gbs']:.0f} GB/s):", "", "| system | batch | decode tok/s | × transformers | of roofline |",
           "|---|---|---|---|---|"]
    for r in d["results"]:
        if "tok_s" not in r:
            continue
        roof = f"{100 * r['fraction_of_roofline']:.1f}% of {r['roofline_tok_s']:.0f}" if r.get("fraction_of_roofline") else ""
        out.append(f"| {r['system']} | {r['batch']} | {r['tok_s']:.1f} | {r['vs_transformers']:.2f} | {roof} |")
    offload = [r for r in d.get("offload", []) if "tok_s" in r]
    if offload:
        out += ["", "The same model with half the experts offloaded (pool size and prefetch depth changed live):", "",
                "| experts | pool | depth | batch | decode tok/s | hit rate | H2D GB |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['system'].split()[1]} | {100 * r['pool_fraction']:.0f}% | {r['depth']} | {r['batch']} | "
                f"{r['tok_s']:.1f} | {100 * r['hit_rate']:.1f}% | {r['h2d_gb']:.2f} |" for r in offload]
    return out


def kernels_table(d: dict) -> list[str]:
    out = [f"MoE layer kernels, one token, 128 experts top-8, hidden 2048, FFN 768 (`{_file('kernels_moe_*.json')}`; "
           f"HBM copy ceiling {d['ceiling_gbs']:.0f} GB/s):", "", "| format | tokens | µs | GB/s | of ceiling |",
           "|---|---|---|---|---|"]
    for r in d["results"]:
        if r["tokens"] in (1, 16):
            out.append(f"| {r['format']} | {r['tokens']} | {1000 * r['ms']:.1f} | {r['gbs']:.0f} | {r['pct_ceiling']:.1f}% |")
    return out


def offload_table(d: dict) -> list[str]:
    out = [f"Expert offload, MoE path of the same shape, bf16 experts (`{_file('offload_*.json')}`; {d['routing']}; "
           f"limit: {d['roofline']}):", "", "| pool | batch | depth | tok/s | H2D GB/s | copy wait ms/step |",
           "|---|---|---|---|---|---|"]
    for r in d["results"]:
        out.append(f"| {100 * r['pool_fraction']:.0f}% | {r['batch']} | {r['depth']} | {r['tok_s']:.1f} | "
                   f"{r['h2d_gb_s']:.1f} | {r['copy_wait_ms_per_step']:.1f} |")
    return out


def cpu_table(d: dict) -> list[str]:
    return [f"CPU decode of the demo model, batch 1, float32 (`{_file('cpu_decode_*.json')}`): Strata "
            f"{d['strata_decode_tok_s']} tok/s, transformers {d['transformers_decode_tok_s']} tok/s, "
            f"{d['ratio']}× (target ≥ {d['target_ratio']}×)."]


def _file(pattern: str) -> str:
    files = sorted(RESULTS.glob(pattern))
    return f"benchmarks/results/{files[-1].name}" if files else "?"


def render() -> str:
    parts: list[list[str]] = []
    for pattern, fn in (("e2e_*.json", e2e_table), ("kernels_moe_*.json", kernels_table),
                        ("offload_*.json", offload_table), ("cpu_decode_*.json", cpu_table)):
        d = _load(pattern)
        if d is not None:
            parts.append(fn(d))
    return "\n\n".join("\n".join(p) for p in parts)


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    block = f"{BEGIN}\n{render()}\n{END}"
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n## Results\n\n" + block + "\n"
    readme.write_text(text)


if __name__ == "__main__":
    main()
