"""Write docs/results.md and the README's headline table from benchmarks/results/*.json.

    python benchmarks/report.py           # rewrites the generated blocks of docs/results.md and README.md
    python benchmarks/report.py --check   # exit 1, naming the file, when either is out of date

Each generated block sits between its markers; the text around it (docs/results.md's notes, the rest
of the README) is kept as written. Each figure appears with the limit it is measured against, as the
result files record it. tests/test_docs.py fails when a generated block is stale.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
RESULTS_DOC = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- RESULTS:BEGIN -->", "<!-- RESULTS:END -->"
INDEX_BEGIN, INDEX_END = "<!-- FILES:BEGIN -->", "<!-- FILES:END -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- HEADLINE:BEGIN -->", "<!-- HEADLINE:END -->"


def _load(name: str) -> dict | None:
    files = sorted(RESULTS.glob(name))
    return json.loads(files[-1].read_text()) if files else None


def e2e_table(d: dict) -> list[str]:
    routing = d.get("routing", "random N(0, 0.02) weights")
    out = [f"End to end, Qwen3-30B-A3B shape on an H200 (`{_file('e2e_*.json')}`; {routing}; medians of interleaved "
           f"rounds; copy ceiling "
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


def int4_lines(d: dict) -> list[str]:
    """The latest int4-only kernel run (launch settings tuned after the full run above)."""
    rows = ", ".join(f"{r['tokens']} token{'s' * (r['tokens'] > 1)} {1000 * r['ms']:.1f} µs (again "
                     f"{1000 * r['ms_again']:.1f}; {r['pct_ceiling']:.1f}%)" for r in d["results"]
                     if r["format"] == "int4" and r["ms"])
    out = [f"int4 alone, later commit {d['commit']} (`{_file('kernels_int4_*.json')}`; ceiling "
           f"{d['ceiling_gbs']:.0f} GB/s): {rows}."]
    norm = [r for r in d["results"] if r["format"] == "int4" and r.get("ms_x_from_norm")]
    if norm:
        out += ["", "As the engine runs it, with x's 16-bit planes written by the add + RMSNorm before the router "
                "(up and down launches only), and counting what that adds to the norm:", "",
                "| tokens | MoE µs | of ceiling | norm µs, without → with planes | of ceiling, with the norm's extra |",
                "|---|---|---|---|---|"]
        out += [f"| {r['tokens']} | {1000 * r['ms_x_from_norm']:.1f} (again {1000 * r['ms_x_from_norm_again']:.1f}) | "
                f"{r['pct_ceiling_x_from_norm']:.1f}% | {1000 * r['norm_ms']:.2f} → {1000 * r['norm_act16_ms']:.2f} | "
                f"{r['pct_ceiling_x_from_norm_with_norm_cost']:.1f}% |" for r in norm]
    return out


def int4_e2e_lines(d: dict) -> list[str]:
    """A later end-to-end run of int4 alone (x's planes from the norm)."""
    rows = ", ".join(f"batch {r['batch']} {r['tok_s']:.1f} tok/s ({r['vs_transformers']:.2f}× transformers"
                     + (f", {100 * r['fraction_of_roofline']:.1f}% of the {r['roofline_tok_s']:.0f} tok/s roofline"
                        if r.get("fraction_of_roofline") else "") + ")"
                     for r in d["results"] if "tok_s" in r and r["system"].startswith("strata"))
    return [f"int4 end to end again, commit {d['environment']['commit'].split()[0]} "
            f"(`{_file('int4_e2e_*.json')}`, transformers timed in the same run): {rows}."]


def offload_table(d: dict) -> list[str]:
    out = [f"Expert offload, MoE path of the same shape, bf16 experts (`{_file('offload_*.json')}`; {d['routing']}; "
           f"limit: {d['roofline']}):", "", "| pool | batch | depth | tok/s | H2D GB/s | copy wait ms/step |",
           "|---|---|---|---|---|---|"]
    for r in d["results"]:
        out.append(f"| {100 * r['pool_fraction']:.0f}% | {r['batch']} | {r['depth']} | {r['tok_s']:.1f} | "
                   f"{r['h2d_gb_s']:.1f} | {r['copy_wait_ms_per_step']:.1f} |")
    return out


def residency_table(d: dict) -> list[str]:
    """The whole engine with an offloaded pool (bench_e2e.py --offload): each row beside its limits."""
    out = [f"Expert residency, the whole engine on the same shape with bf16 experts (`{_file('residency_*.json')}`; "
           f"pinned host-to-device {d['pinned_h2d_gbs']:.1f} GB/s; ms per generated token; C = the 100%-pool time, "
           "M = bytes over the bus / pinned bandwidth; medians of the rounds where there were several):", "",
           "| routing | pool | depth | misses | batch | tok/s | ms | C + M | max(C, M) | hit rate | prefetches used "
           "| MB/token over the bus |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for routing, block in d["offload"].items():
        for r in block.get("rows", []):
            lim = (f"{r['serial_limit_ms']:.2f} | {r['overlap_limit_ms']:.2f}" if "serial_limit_ms" in r else "| ")
            misses = "read directly" if r.get("direct_reads") else "copied in"
            made = r["prefetch_hits"] + r["prefetch_wasted"]
            used = f"{r['prefetch_hits']} of {made}" if made else "-"
            out.append(f"| {routing} | {100 * r['pool_fraction']:.0f}% | {r['depth']} | {misses} | {r['batch']} | "
                       f"{r['tok_s']:.1f} | "
                       f"{r['ms_per_token']:.2f} | {lim} | {100 * r['hit_rate']:.1f}% | {used} | "
                       f"{r['h2d_bytes_per_token'] / 1e6:.0f} |")
    out.append("")
    for s in d.get("summary", []):
        parts = [f"{s['routing']}, batch {s['batch']}:"]
        if "pool50_depth2_over_depth0" in s:
            parts.append(f"50% pool, depth 2 / depth 0 = {s['pool50_depth2_over_depth0']:.2f}× "
                         f"(ideal overlap {s['pool50_ideal']:.2f}×);")
        if "pool0_bus_gb_s" in s:
            parts.append(f"0% pool moves {s['pool0_bus_gb_s']:.1f} GB/s = {100 * s['pool0_bus_fraction_of_pinned']:.0f}% "
                         "of pinned;")
        if "within_budget" in s:
            parts.append(f"engine peak {s['max_engine_peak_gb']:.1f} GB, within the budget: {s['within_budget']}.")
        out.append("- " + " ".join(parts))
    full = next((f for f in sorted(RESULTS.glob("residency_*.json"), reverse=True)
                 if any(r["pool_fraction"] == 0 for b in json.loads(f.read_text())["offload"].values()
                        for r in b.get("rows", []))), None)
    if full is not None:
        doc = json.loads(full.read_text())
        pinned = doc["pinned_h2d_gbs"]
        rows = [(routing, r) for routing, b in doc["offload"].items() for r in b.get("rows", [])
                if r["pool_fraction"] == 0 and r["depth"] == 0]
        out.append(f"- Miss-bound decode, 0% pool, depth 0 (`benchmarks/results/{full.name}`, the full grid of pools "
                   f"0/25/50/100% and depths 0/1/2; pinned {pinned:.1f} GB/s): " + "; ".join(
                       f"{routing} batch {r['batch']}: copies at {r['serial_copy_gb_s']:.1f} GB/s = "
                       f"{100 * r['serial_copy_gb_s'] / pinned:.0f}% of pinned (bytes / (time − C)), bus busy "
                       f"{100 * r['bus_gb_s'] / pinned:.0f}% of the wall time" for routing, r in rows) + ".")
    return out


def pool50_lines(_: dict) -> list[str]:
    """The 50% pool in steady state (64 tokens after 16 warm-up), one line per run."""
    out = ["The 50% pool in steady state (64 tokens per sequence after 16 warm-up; depth 2 over depth 0, the two "
           "timed in the same process, each row the median round (of two: the faster); ms per token; in brackets the ideal overlap (C + M0) / max(C, M0), where C is "
           "the full pool's time and M0 depth 0's bus bytes over the pinned bandwidth):", ""]
    for f in sorted(RESULTS.glob("residency50_*.json")):
        d = json.loads(f.read_text())
        rows = [r for b in d["offload"].values() for r in b.get("rows", [])]
        pick = lambda s, depth: next(r for r in rows if (r["routing"], r["batch"], r["depth"]) == (s["routing"], s["batch"], depth)  # noqa: E731
                                     and r["pool_fraction"] == 0.5 and r.get("policy") == s.get("policy", r.get("policy")))
        policies = {s.get("policy") for s in d["summary"]}
        label = lambda s: f"{s['routing']} batch {s['batch']}" + (f" {s['policy']}" if len(policies) > 1 else "")  # noqa: E731
        cells = [f"{label(s)} {s['pool50_depth2_over_depth0']:.2f}× "
                 f"({pick(s, 0)['ms_per_token']:.2f} → "
                 f"{pick(s, 2)['ms_per_token']:.2f}"
                 + (f"; ideal {s['pool50_ideal']:.2f}×)" if s.get("pool50_ideal") else ")") for s in d["summary"]]
        n = len(rows[0].get("rounds_tok_s", [1])) if rows else 1
        rounds = {1: "one round", 2: "the faster of 2 rounds"}.get(n, f"the median of {n} rounds")
        out.append(f"- `benchmarks/results/{f.name}` (commit {d['environment']['commit'].split()[0]}; {rounds}): "
                   + "; ".join(cells) + "." + (f" {d['caveat']}" if d.get("caveat") else ""))
    return out


def pool0_lines(d: dict) -> list[str]:
    """A later check of the miss-bound decode (0% pool, depth 0) against the 85% target."""
    pinned = d["pinned_h2d_gbs"]
    cells = [f"batch {s['batch']} moves {s['pool0_bus_gb_s']:.1f} GB/s over the wall time = "
             f"{100 * s['pool0_bus_fraction_of_pinned']:.0f}% of pinned, copies at {s['pool0_serial_copy_gb_s']:.1f} GB/s "
             f"= {100 * s['pool0_serial_copy_fraction_of_pinned']:.0f}% (bytes / (time − C))"
             for s in d["summary"] if "pool0_bus_gb_s" in s]
    return [f"Miss-bound decode rechecked at commit {d['environment']['commit'].split()[0]} "
            f"(`{_file('pool0_recheck_*.json')}`; {d['summary'][0]['routing']} routing, pinned {pinned:.1f} GB/s, "
            "target 85%): " + "; ".join(cells) + "."]


def cpu_table(d: dict) -> list[str]:
    return [f"CPU decode of the demo model, batch 1, float32 (`{_file('cpu_decode_*.json')}`): Strata "
            f"{d['strata_decode_tok_s']} tok/s, transformers {d['transformers_decode_tok_s']} tok/s, "
            f"{d['ratio']}× (target ≥ {d['target_ratio']}×)."]


def _file(pattern: str) -> str:
    files = sorted(RESULTS.glob(pattern))
    return f"benchmarks/results/{files[-1].name}" if files else "?"


def _newest_per_key(pattern: str, rows_of, key) -> list[tuple[str, dict]]:
    """``(file, row)`` for each key, from the newest file matching ``pattern`` that has a row with it."""
    seen: dict = {}
    for f in sorted(RESULTS.glob(pattern), reverse=True):
        for row in rows_of(json.loads(f.read_text())):
            seen.setdefault(key(row), (f"benchmarks/results/{f.name}", row))
    return list(seen.values())


def serve_table(_: dict) -> list[str]:
    rows = _newest_per_key("serve_*.json", lambda d: [{**r, "rounds": d["rounds"], "limits": d["limits"]}
                                                       for r in d["summary"]],
                           lambda r: (r["config"], r["workload"]))
    rows.sort(key=lambda fr: (fr[1]["config"] != "resident", fr[1]["config"], fr[1]["workload"]))
    lim = rows[0][1]["limits"]
    out = [f"Serving, the same shape with int4 experts on an H200 (each configuration's newest run; every HTTP run "
           f"beside the same workload in-process, through the same engine loop, alternating rounds; copy ceiling "
           f"{lim['hbm_gb_s']:.0f} GB/s, pinned bus {lim['bus_gb_s']:.1f} GB/s):", "",
           "| config | workload | streams | tok/s in-process | tok/s HTTP | HTTP ÷ in-process | per stream in / HTTP "
           "| TTFT p50 ms in / HTTP | TTFT added by HTTP, ms | file |", "|---|---|---|---|---|---|---|---|---|---|"]
    for f, r in rows:
        out.append(f"| {r['config']} | {r['workload']} | {r['streams']} | {r['in_process_output_tok_s']:.1f} | "
                   f"{r['http_output_tok_s']:.1f} | {r['http_over_in_process_tok_s']:.3f} | "
                   f"{r['in_process_stream_tok_s']:.1f} / {r['http_stream_tok_s']:.1f} | "
                   f"{r['in_process_ttft_p50_ms']:.0f} / {r['http_ttft_p50_ms']:.0f} | {r['ttft_added_by_http_ms']:.1f} | "
                   f"`{f.rsplit('/', 1)[-1]}` |")
    out += ["", "ttft-probe sends one request at a time to an idle engine: what HTTP itself adds to the first token. "
            "In a burst, requests reach the engine over HTTP about a millisecond apart, so the first one's prefill "
            "step starts alone and the others wait for it; in-process every request is queued before the first step."]
    return out


def _on_h200(d: dict) -> bool:
    """Whether a result file was measured on the H200 the tables speak of (a run on another card is indexed, not
    tabled: its limits are that card's)."""
    env = d.get("environment") if isinstance(d.get("environment"), dict) else {}
    return "H200" in str(env.get("gpu", "NVIDIA H200"))


def _gpt_oss_rows(d: dict) -> list[dict]:
    if d.get("not_in_tables") or not _on_h200(d):   # a run with a defect found later, or on another card
        return []
    rows = [r for r in d.get("a", []) if "tok_s" in r]
    for block in d.get("120b", {}).values():
        rows += [r for r in block.get("rows", []) + block.get("ladder", []) if "tok_s" in r]
    return rows


def gpt_oss_table(_: dict) -> list[str]:
    rows = []
    for cell in ("a", "b", "c"):                 # each cell's rows from the newest run that measured it
        newest = _newest_per_key("gpt_oss_*.json", lambda d, c=cell: [{"rows": _gpt_oss_rows(d)}]
                                 if any(r["cell"] == c for r in _gpt_oss_rows(d)) else [], lambda _: cell)
        rows += [(f, r) for f, got in newest for r in got["rows"] if r["cell"] == cell]
    rows.sort(key=lambda fr: (fr[1]["cell"], fr[1].get("rung", 0), fr[1]["routing"], fr[1].get("batch", 1)))
    out = ["gpt-oss shapes on an H200, MXFP4 experts, random weights (a: 20b, every expert resident, against the HBM "
           "roofline; b: 120b under `--gpu-memory-budget 24G`, against the bus-bound limit = pinned H2D GB/s ÷ bytes "
           "crossing per token; c: the first article's ladder on 120b at 24 GB, batch 16; each cell's newest run):", "",
           "| cell | routing | batch | config | tok/s | hit rate | bus GB/s | limit tok/s | of limit | peak GB | file |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for f, r in rows:
        limit = r.get("roofline_tok_s") or r.get("bus_limit_tok_s")
        share = r.get("fraction_of_roofline") or r.get("fraction_of_bus_limit")
        out.append(f"| {r['cell']} | {r['routing']} | {r.get('batch', 1)} | {r.get('config', '')} | {r['tok_s']:.1f} | "
                   f"{r.get('hit_rate', 1.0):.0%} | {r.get('bus_gb_s', 0.0):.1f} | {limit:.0f} | {share:.0%} | "
                   f"{r.get('peak_gb', 0.0):.1f} | `{f.rsplit('/', 1)[-1]}` |")
    return out



SECTIONS = (("e2e_*.json", e2e_table), ("kernels_moe_*.json", kernels_table), ("kernels_int4_*.json", int4_lines),
            ("int4_e2e_*.json", int4_e2e_lines), ("offload_*.json", offload_table),
            ("residency_*.json", residency_table), ("residency50_*.json", pool50_lines),
            ("pool0_recheck_*.json", pool0_lines), ("cpu_decode_*.json", cpu_table), ("serve_*.json", serve_table),
            ("gpt_oss_*.json", gpt_oss_table))


def results_block() -> str:
    """docs/results.md's tables: the newest run of each benchmark, each figure beside its limit."""
    parts = [fn(d) for pattern, fn in SECTIONS if (d := _load(pattern)) is not None]
    return "\n\n".join("\n".join(p) for p in parts)


# What a family of result files measures, for files that do not say it themselves (by name prefix).
PRODUCERS = {
    "attention_": "paged decode attention against the HBM ceiling (benchmarks/kernels/bench_attention.py)",
    "cpu_decode_": "CPU decode of the demo model against transformers (benchmarks/bench_cpu_decode.py)",
    "cpu_experts_": "cold experts computed on the host CPU against its measured bandwidth (benchmarks/bench_cpu_experts.py)",
    "cpu_threads_": "CPU math threads against decode speed (benchmarks/cpu_threads.py)",
    "e2e_": "end to end against transformers, Qwen3-30B-A3B shape (benchmarks/bench_e2e.py)",
    "gpt_oss_": "gpt-oss shapes, MXFP4 experts (benchmarks/bench_gpt_oss.py)",
    "gui_long_chat_": "the workbench's event loop while a long chat opens, fills in and streams (benchmarks/gui_long_chat.py)",
    "gui_stall_": "the workbench's event loop while a model loads (benchmarks/gui_stall.py)",
    "int4_e2e_": "int4 end to end against transformers (benchmarks/bench_e2e.py)",
    "kernels_": "MoE layer kernels per format against the HBM ceiling (benchmarks/kernels/bench_moe.py)",
    "lab_moe_decode_": "each decode MoE kernel's time, launch sweeps and the read ceiling of its split (benchmarks/kernels/lab_moe_decode.py)",
    "memory_": "GPU memory of an offloaded model: torch's peak against the memory plan (benchmarks/memory_profile.py)",
    "llamacpp_kit_": "Strata against llama.cpp on the same weights in one run (the llama.cpp comparison kit)",
    "lfu_decay_": "pool hit rate per LFU decay (benchmarks/lfu_decay.py)",
    "offload_": "expert offload, the MoE path alone (benchmarks/bench_offload.py)",
    "qlinear_": "8-bit resident linear kernels against cuBLAS bf16 at model shapes (benchmarks/kernels/bench_qlinear.py)",
    "profile_gpt_oss_": "kernel time of a gpt-oss decode step (benchmarks/profile_gpt_oss.py)",
    "cold_profile_": "where an eager step with a CPU share spends its host time (benchmarks/cold_profile.py)",
    "cold_experts_": "cold experts over the bus against the bus and the host CPU (benchmarks/cold_experts.py)",
    "rebuild24_": "the residency rebuild against its baseline commit (benchmarks/bench_e2e.py)",
    "residency50_": "the 50% pool in steady state, depth 2 against depth 0 (benchmarks/bench_e2e.py --offload)",
    "residency_2": "the residency grid: pools, depths, batches, routings (benchmarks/bench_e2e.py --offload)",
    "serve_": "serving over HTTP beside the same workload in-process (benchmarks/bench_serve.py)",
    "server_overhead_": "the HTTP server's own cost per streamed token (benchmarks/server_overhead.py)",
}


def _describe(name: str, d: dict) -> str:
    """A result file's one-line account of what it measured: its own words where it has them."""
    producer = next((v for k, v in PRODUCERS.items() if name.startswith(k)), "")
    own = re.sub(r"\s*\([^()]*\)", "", str(d.get("what") or d.get("note") or ""))   # asides stay in the file
    text = (str(d.get("what") or "") and own) or producer or own
    text = text.replace("|", "/").replace("\n", " ")
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return first if len(first) <= 200 else first[:first.rindex(" ", 0, 199)] + " …"


def file_index() -> str:
    """Every result file, newest first: date, commit, what it measured."""
    out = ["| file | date | commit | what |", "|---|---|---|---|"]
    for f in sorted(RESULTS.glob("*.json"), key=lambda f: (_date(f), f.name), reverse=True):
        d = json.loads(f.read_text())
        env = d.get("environment") if isinstance(d.get("environment"), dict) else {}
        commit = str(env.get("commit") or d.get("commit") or "").split(" ")[0][:12]
        out.append(f"| [{f.name}](../benchmarks/results/{f.name}) | {_date(f)} | {commit} | {_describe(f.name, d)} |")
    return "\n".join(out)


def _date(f: Path) -> str:
    found = re.search(r"\d{4}-\d{2}-\d{2}", f.name)
    return found.group(0) if found else ""


def _newest(pattern: str, rows_of, match) -> dict:
    """The first row that ``match`` accepts, from the newest file matching ``pattern`` that has one."""
    for f in sorted(RESULTS.glob(pattern), reverse=True):
        for row in rows_of(json.loads(f.read_text())):
            if match(row):
                return row
    raise LookupError(f"no row in benchmarks/results/{pattern} for the README's headline: add that run or drop its row")


def _residency_rows(d: dict) -> list[dict]:
    return [r for block in d["offload"].values() for r in block.get("rows", [])]


def _headline_rows() -> list[tuple[str, str, float, str]]:
    """``(model, setting, decode tok/s, against what)`` for the README."""
    e2e = lambda b: _newest("e2e_*.json", lambda d: d["results"],
                            lambda r: r.get("system") == "strata int4" and r["batch"] == b and "tok_s" in r)
    one, eight = e2e(1), e2e(8)
    pool = lambda frac: _newest("residency_*.json", _residency_rows,
                                lambda r: (r["routing"], r["pool_fraction"], r["depth"], r["batch"])
                                == ("trained-like", frac, 2 if frac < 1 else 0, 8))
    half, full = pool(0.5), pool(1.0)
    serve = _newest("serve_*.json", lambda d: d["summary"],
                    lambda r: (r["config"], r["workload"]) == ("resident", "four-streams"))
    oss = lambda cell, batch: _newest("gpt_oss_*.json", _gpt_oss_rows,
                                      lambda r: r["cell"] == cell and r.get("batch", 1) == batch
                                      and r["routing"] == ("uniform" if cell == "a" else "trained-like"))
    small, big = oss("a", 1), oss("b", 16)
    cpu = _load("cpu_decode_*.json") or {}
    rows = [("Qwen3-30B-A3B, int4", "every expert on the GPU, batch 1", one["tok_s"],
             f"{one['vs_transformers']:.1f}× transformers, {one['fraction_of_roofline']:.0%} of the HBM roofline"),
            ("Qwen3-30B-A3B, int4", "every expert on the GPU, batch 8", eight["tok_s"],
             f"{eight['vs_transformers']:.1f}× transformers"),
            ("Qwen3-30B-A3B, bf16", "half the experts on the GPU, depth 2, batch 8", half["tok_s"],
             f"hit rate {half['hit_rate']:.0%}; {full['tok_s']:.0f} with every expert on the GPU"),
            ("Qwen3-30B-A3B, int4", "`serve`, 4 streams over HTTP", serve["http_output_tok_s"],
             f"{serve['http_over_in_process_tok_s']:.3f}× in-process"),
            ("gpt-oss-20b, MXFP4", "every expert on the GPU, batch 1", small["tok_s"],
             f"{small['fraction_of_roofline']:.0%} of the HBM roofline"),
            ("gpt-oss-120b, MXFP4", "`--gpu-memory-budget 24G`, batch 16", big["tok_s"],
             f"{big['fraction_of_bus_limit']:.0%} of the bus limit")]
    if cpu:
        rows.append(("demo model, CPU", "float32, batch 1", cpu["strata_decode_tok_s"],
                     f"{cpu['ratio']}× transformers"))
    return rows


def headline() -> str:
    """The README's table: a few rows of the newest runs (H200; random weights, trained-like routing)."""
    out = ["| model | setting | tok/s | against |", "|---|---|---|---|"]
    out += [f"| {m} | {s} | {t:.0f} | {a} |" for m, s, t, a in _headline_rows()]
    return "\n".join(out)


RESULTS_TEMPLATE = f"# Results\n\n{BEGIN}\n{END}\n\n## Every result file\n\n{INDEX_BEGIN}\n{INDEX_END}\n"


def replace_block(text: str, begin: str, end: str, body: str, name: str) -> str:
    """``text`` with what lies between ``begin`` and ``end`` replaced by ``body``."""
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"{name} needs the markers {begin} and {end} once each: put them back where the "
                         "generated text goes")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"


def updated_results(text: str) -> str:
    """docs/results.md's ``text`` with its tables and its file index generated again."""
    text = replace_block(text, BEGIN, END, results_block(), "docs/results.md")
    return replace_block(text, INDEX_BEGIN, INDEX_END, file_index(), "docs/results.md")


def updated_readme(text: str) -> str:
    """README.md's ``text`` with its headline table generated again."""
    return replace_block(text, HEADLINE_BEGIN, HEADLINE_END, headline(), "README.md")


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python benchmarks/report.py [--check]", file=sys.stderr)
        return 2
    targets = ((RESULTS_DOC, updated_results), (README, updated_readme))
    stale = []
    for path, update in targets:
        text = path.read_text() if path.exists() else RESULTS_TEMPLATE
        try:
            new = update(text)
        except (ValueError, LookupError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if new != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if not check:
                path.write_text(new)
    if check and stale:
        print(f"error: {', '.join(stale)} out of date: run python benchmarks/report.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
