"""GPU microbenchmark of latent-attention decode (DeepSeek-V3 shape: 128 heads, latent 512 + rotary 64,
bf16 cache, block size 16): the Triton kernel (kernels/latent_attention.py) against the torch path it
replaced in decode steps (engine/models/mla.py ``_decode``, which covers every position of the table).

Each case: batch B, every sequence at context C, block tables as wide as ``--table`` positions (the
longest context the cache allows, which a recorded step's torch path reads whatever C is). Bytes = the
latent rows of every context token read once (576 values); GB/s against the device-to-device copy ceiling
measured in the same run. Times are ``triton.testing.do_bench`` medians (L2 cleared before each call).

Run: ``python benchmarks/kernels/bench_latent.py --out results.json``.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import environment, write_result  # noqa: E402
from engine.kv.cache import KVCache  # noqa: E402
from engine.models.mla import _decode  # noqa: E402
from kernels.latent_attention import latent_decode_attention, latent_decode_attention_ref  # noqa: E402
from kernels.paged_attention import context_rows  # noqa: E402

H, R, P, BLOCK = 128, 512, 64, 16


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=5, rep=40, return_mode="median"))


def copy_ceiling_gbs() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / bench_ms(lambda: y.copy_(x)) / 1e6


def case(batch: int, context: int, table: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + context)
    width = math.ceil(table / BLOCK)
    blocks = batch * width + 1
    cache = KVCache(1, blocks, BLOCK, 1, R, torch.bfloat16, torch.device("cuda"), v_head_dim=P)
    cache.k[0].normal_(generator=g)
    cache.v[0].normal_(generator=g)
    tables = torch.randperm(blocks - 1, device="cuda", generator=g)[:batch * width].view(batch, width).int()
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    q = (torch.randn(batch, H, R + P, device="cuda", generator=g) * 0.05).bfloat16()
    scale = 1 / math.sqrt(192)
    got = latent_decode_attention(q, cache.k[0], cache.v[0], tables, lens, BLOCK, scale)
    want = latent_decode_attention_ref(q.float(), cache.k[0].float(), cache.v[0].float(), tables, lens, BLOCK, scale)
    err = float((got.float() - want).abs().max())
    rows, valid = context_rows(tables, lens, BLOCK)
    kernel = bench_ms(lambda: latent_decode_attention(q, cache.k[0], cache.v[0], tables, lens, BLOCK, scale))
    torch_ms = bench_ms(lambda: _decode(q, cache, 0, rows, valid, R, scale))
    nbytes = batch * context * (R + P) * 2
    return {"batch": batch, "context": context, "table": table, "kernel_ms": kernel, "torch_ms": torch_ms,
            "speedup": torch_ms / kernel, "kernel_gbs": nbytes / kernel / 1e6, "max_abs_err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--table", type=int, default=32768, help="positions a block table covers")
    a = ap.parse_args()
    ceiling = copy_ceiling_gbs()
    rows = []
    for batch in (1, 8):
        for context in (1024, 8192):
            r = case(batch, context, a.table)
            r["of_ceiling"] = r["kernel_gbs"] / ceiling
            rows.append(r)
            if a.out:
                write_result(a.out, {"environment": environment(), "benchmark": "bench_latent",
                                     "what": "latent-attention decode, Triton kernel against the torch path",
                                     "shape": {"heads": H, "latent": R, "rotary": P, "block": BLOCK},
                                     "copy_ceiling_gbs": ceiling, "rows": rows})
    print(f"copy ceiling {ceiling:.0f} GB/s; table {a.table} positions")
    print("batch context  kernel_ms  torch_ms  speedup  GB/s  of_ceiling  max_err")
    for r in rows:
        print(f"{r['batch']:5d} {r['context']:7d} {r['kernel_ms']:10.4f} {r['torch_ms']:9.3f} {r['speedup']:8.1f} "
              f"{r['kernel_gbs']:5.0f} {r['of_ceiling']:10.1%} {r['max_abs_err']:8.4f}")


if __name__ == "__main__":
    main()
