"""8-bit resident linear layers on the GPU: the Triton kernel against cuBLAS bf16 at model shapes.

    python benchmarks/kernels/bench_qlinear.py [--out FILE]

For each shape (gpt-oss and Qwen3-30B-A3B attention, the LM heads) and token count it times the bf16
GEMM (``F.linear``) and the fp8 / int8 kernel with CUDA graphs of 20 calls, and reports microseconds,
the weight bytes read per microsecond (GB/s) and that as a share of the HBM bandwidth measured in the same
run (a device-to-device copy of 1 GiB).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.qlinear import linear, quantize_rows  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = hbm_gbs()
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
