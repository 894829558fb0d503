"""8-bit resident linear layers on the GPU: the Triton kernel against cuBLAS bf16 at model shapes.

    python benchmarks/kernels/bench_qlinear.py [--out FILE]

For each shape (gpt-oss and Qwen3-30B-A3B attention, the LM heads) and token count it times the bf16
GEMM (``F.linear``) and the fp8 / int8 kernel with CUDA graphs of 20 calls, and reports microseconds,
the weight bytes read per microsecond (GB/s) and that as a share of the HBM bandwidth measured in the same
run (a device-to-device copy of 1 GiB).

``--gemv-sweep`` times the one-token kernel's launch settings instead, at the shapes a decode step
meets, each call reading another copy of the matrix (at least 256 MB of copies in turn, so that the
bytes come from HBM and not from the 50 MB L2, as in a step that walks 12+ layers), against cuBLAS bf16
read the same way.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels._triton import cdiv  # noqa: E402
from kernels.qlinear import _qgemv_kernel, linear, quantize_rows  # noqa: E402

SHAPES = {   # name -> (N, K)
    "gpt-oss qkv": (5120, 2880), "gpt-oss o": (2880, 4096), "gpt-oss lm_head": (201088, 2880),
    "qwen3 qkv": (5120, 2048), "qwen3 o": (2048, 4096), "qwen3 lm_head": (151936, 2048),
}
CALLS = 20


def _time(fn) -> float:
    """Microseconds per call: a graph of CALLS calls, median of 5 replays."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return sorted(times)[2]


def hbm_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = _time(lambda: dst.copy_(src))
    return 2 * src.numel() / us / 1e3


GEMV_SETTINGS = [(bn, bk, w, st) for bn in (8, 16, 32) for bk in (256, 512, 1024) for w in (4, 8) for st in (2, 4)]
GEMV_SHAPES = ("qwen3 qkv", "qwen3 o", "qwen3 lm_head", "gpt-oss qkv")


def gemv_sweep(bw: float) -> list[dict]:
    """One token, each launch setting (BLOCK_N, BLOCK_K, warps, stages) of the 8-bit GEMV kernel and
    cuBLAS bf16, every call on another copy of the matrix (HBM reads, not L2)."""
    rows = []
    for name in GEMV_SHAPES:
        n, k = SHAPES[name]
        w16 = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        copies = max(1, -(-(256 << 20) // (n * k)))              # of the 8-bit matrix: 256 MB or more
        ws16 = [w16.clone() for _ in range(max(1, copies // 2))]
        us = _time(lambda: [torch.nn.functional.linear(x, w) for w in ws16]) / len(ws16)
        row = {"shape": name, "N": n, "K": k, "copies_8bit": copies, "bf16_us": us,
               "bf16_gbs": n * k * 2 / us / 1e3}
        ws16.clear()
        for fmt in ("fp8", "int8"):
            ws = [quantize_rows(w16, fmt) for _ in range(copies)]
            y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            results = []
            for bn, bk, warps, stages in GEMV_SETTINGS:
                if bk > k:
                    continue
                def call():
                    for w in ws:
                        _qgemv_kernel[(cdiv(n, bn),)](x, w.q, w.scale, w.scale, y, n, k, w.q.stride(0), HAS_BIAS=False,
                                                      BLOCK_N=bn, BLOCK_K=bk, EVEN_K=k % bk == 0, num_warps=warps,
                                                      num_stages=stages)
                try:
                    t = _time(call) / len(ws)
                except Exception as e:                           # a setting that does not compile
                    results.append({"setting": [bn, bk, warps, stages], "error": f"{type(e).__name__}"})
                    continue
                results.append({"setting": [bn, bk, warps, stages], "us": t, "gbs": ws[0].nbytes / t / 1e3})
            engine = _time(lambda: [linear(x, w, kernel=True) for w in ws]) / len(ws)
            timed = [r for r in results if "us" in r]
            best = min(timed, key=lambda r: r["us"])
            row[fmt] = {"engine_us": engine, "engine_gbs": ws[0].nbytes / engine / 1e3, "best": best,
                        "settings": results}
            ws.clear()
        rows.append(row)
        print(f"{name:<16} bf16 {row['bf16_us']:7.1f} us {100 * row['bf16_gbs'] / bw:4.0f}% | " + " | ".join(
            f"{fmt} engine {row[fmt]['engine_us']:6.1f} us {100 * row[fmt]['engine_gbs'] / bw:4.0f}%, best "
            f"{row[fmt]['best']['us']:6.1f} us {100 * row[fmt]['best']['gbs'] / bw:4.0f}% {row[fmt]['best']['setting']}"
            for fmt in ("fp8", "int8")), flush=True)
        del w16
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--gemv-sweep", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = hbm_gbs()
    if args.gemv_sweep:
        print(f"HBM copy bandwidth {bw:.0f} GB/s")
        rows = gemv_sweep(bw)
        if args.out:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
            Path(args.out).write_text(json.dumps({"benchmark": "qgemv_sweep", "gpu": torch.cuda.get_device_name(),
                                                  "triton": __import__("triton").__version__, "commit": commit or None,
                                                  "hbm_copy_gbs": bw, "results": rows}, indent=1))
        return
    rows = []
    for name, (n, k) in SHAPES.items():
        w16 = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        quant = {fmt: quantize_rows(w16, fmt) for fmt in ("fp8", "int8")}
        for t in (int(s) for s in args.tokens.split(",")):
            x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
            row = {"shape": name, "N": n, "K": k, "tokens": t}
            us = _time(lambda: torch.nn.functional.linear(x, w16))
            row["bf16_us"], row["bf16_gbs"] = us, w16.numel() * 2 / us / 1e3
            for fmt, w in quant.items():
                us = _time(lambda: linear(x, w, kernel=True))   # the engine path
                row[f"{fmt}_us"], row[f"{fmt}_gbs"] = us, w.nbytes / us / 1e3
                row[f"{fmt}_speedup"] = row["bf16_us"] / us
            rows.append(row)
        del w16, quant
        torch.cuda.empty_cache()
    print(f"HBM copy bandwidth {bw:.0f} GB/s")
    print(f"{'shape':<18}{'T':>4}{'bf16 us':>9}{'%hbm':>6}{'fp8 us':>9}{'%hbm':>6}{'x':>6}{'int8 us':>9}{'%hbm':>6}{'x':>6}")
    for r in rows:
        print(f"{r['shape']:<18}{r['tokens']:>4}{r['bf16_us']:>9.1f}{100 * r['bf16_gbs'] / bw:>6.0f}"
              f"{r['fp8_us']:>9.1f}{100 * r['fp8_gbs'] / bw:>6.0f}{r['fp8_speedup']:>6.2f}"
              f"{r['int8_us']:>9.1f}{100 * r['int8_gbs'] / bw:>6.0f}{r['int8_speedup']:>6.2f}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        doc = {"benchmark": "qlinear", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "commit": commit or None, "hbm_copy_gbs": bw,
               "limit": "weight bytes per call / HBM copy bandwidth", "results": rows}
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
