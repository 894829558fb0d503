"""Which one-token 16-bit matrices of the gpt-oss-20b decode step take the gemv16 kernel, and why the rest
do not: the step's every ``gemv16_fits`` decision of one token, by matrix shape, dtypes and strides.

On the H100 at bb7c90c gpt-oss-20b decoded at the same speed with ``kernels/qlinear.GEMV16`` on and off
(381.6 tok/s, benchmarks/results/gemv_warm_ab_2026-12-07.json), where the Qwen3-shaped bf16 step gained
(step_profile_2026-12-06d.json): this says whether its matrices reach the kernel at all.

    python benchmarks/gemv16_probe.py OUT.json [bench_gpt_oss.py flags, e.g. --tiny]
"""
from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import engine.models.moe_transformer as mt  # noqa: E402
import kernels.qlinear as q  # noqa: E402


def main(argv: list[str]) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    fits, run, was = q.gemv16_fits, q.gemv16, q.GEMV16
    q.GEMV16 = True

    def probe_fits(x, w):
        ok = fits(x, w)
        if x.dim() == 2 and x.shape[0] == 1:
            seen[(ok, tuple(w.shape), str(x.dtype), str(w.dtype), tuple(w.stride()), x.is_cuda)] += 1
        return ok

    def counted(x, w, bias=None):
        seen["gemv16 calls"] += 1
        return run(x, w, bias)

    q.gemv16_fits, q.gemv16 = probe_fits, counted         # linear() looks both up in its module
    mt.gemv16_fits, mt.gemv16 = probe_fits, counted       # the router imported them by name
    try:
        from benchmarks import bench_gpt_oss
        bench_gpt_oss.main(["--cells", "a", "--routing", "uniform", "--rounds-a", "1", "--out", argv[0], *argv[1:]])
    finally:
        q.gemv16_fits, q.gemv16, mt.gemv16_fits, mt.gemv16, q.GEMV16 = fits, run, fits, run, was
    for key, n in seen.most_common(16):
        print("probe", key, n)
    return seen


if __name__ == "__main__":
    main(sys.argv[1:])
