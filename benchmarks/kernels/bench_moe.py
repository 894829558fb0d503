"""GPU microbenchmark of the fused MoE kernels on layers of a real model's shape.

``--shape``: Qwen3-30B-A3B (default: 128 experts, top-8, hidden 2048, expert FFN 768), gpt-oss-20b (32
experts, top-4, hidden and FFN 2880) or gpt-oss-120b (128 experts); 1, 4, 16 and 64 tokens; bf16, fp8,
int4 and mxfp4 experts (``--tokens`` and ``--formats`` pick fewer).
For each case: median time per layer (CUDA-graph replay of ``--layers`` layers with their own pools
and routings, so L2 never holds the weights of the next layer), bytes = packed bytes of the distinct
experts touched, read once, plus activations in and out; GB/s against the device-copy ceiling measured
in the same run. Every setting is checked against the torch reference on the GPU (bf16 activations)
before it is timed; the best setting is timed twice (the spread); the plain-torch reference is timed
eagerly beside it. ``--grouped-mm`` (on by default) also times
``torch._grouped_mm`` (bf16). ``--out`` gets the full JSON with the whole sweep, ``--configs-out`` the
tuned table.

int4 decode (up to 16 tokens) is timed two ways: with its own prep launch making x's 16-bit planes
(``ms``), and as the engine runs it, with the planes written by the add + RMSNorm before the router
(``ms_x_from_norm``: up and down only; the tuned table is for this). The cost moved into the norm is
measured in the same run (``norm_ms`` against ``norm_act16_ms``) and reported beside it
(``pct_ceiling_x_from_norm_with_norm_cost``).

Run: ``python benchmarks/kernels/bench_moe.py --out results.json [--configs-out NVIDIA_H200.json]
[--formats int4,fp8] [--tokens 1,4,16] [--shape gpt-oss-20b]``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.expert_layout import ExpertLayout  # noqa: E402
from kernels.quant import quantize_expert  # noqa: E402
from kernels.act16 import act16  # noqa: E402
from kernels.decode_ops import add_rms_norm, add_rms_norm_act16  # noqa: E402
from kernels.fused_moe import fused_moe, fused_moe_ref  # noqa: E402
from kernels.moe_align import moe_align, moe_align_ref  # noqa: E402
from kernels.moe_config import MoeLaunchConfig, TileConfig  # noqa: E402
from kernels.router import route, route_ref  # noqa: E402



@dataclass(frozen=True)
class Shape:
    """One MoE layer: experts, experts per token, hidden, expert FFN, int4 group size."""
    experts: int
    top_k: int
    hidden: int
    ffn: int
    group: int


SHAPES = {"qwen3-30b-a3b": Shape(128, 8, 2048, 768, 128),
          "gpt-oss-20b": Shape(32, 4, 2880, 2880, 64),       # int4 groups of 64: 128 does not divide 2880
          "gpt-oss-120b": Shape(128, 4, 2880, 2880, 64)}
FORMATS = ("bf16", "fp8", "int4", "mxfp4")
TOKENS = (1, 4, 16, 64, 512)
# Decode candidates per format: (up, down) as (block_n, block_k, num_warps[, num_stages]). Up programs
# read 2*block_n rows of one expert; down programs read block_n rows of each of a token's k experts.
DECODE_TILES = {
    "bf16": [((4, 1024, 4), (1, 1024, 4)), ((2, 2048, 4), (2, 1024, 8)), ((8, 512, 4), (1, 512, 4)),
             ((4, 1024, 8), (2, 512, 4))],
    "fp8": [((2, 2048, 4), (1, 512, 4)), ((4, 1024, 4), (2, 512, 2)), ((1, 2048, 4), (1, 512, 2)),
            ((2, 2048, 8), (1, 1024, 8)), ((1, 1024, 2), (1, 256, 2)), ((2, 1024, 2), (1, 256, 2)),
            ((1, 1024, 2, 4), (1, 256, 2, 4)), ((4, 512, 4), (1, 256, 2)), ((1, 2048, 2), (2, 256, 2))],
    # int4 block_k counts elements; up tiles are [block_k/G groups, 2, BN, G/8 words], down [., k, BN,
    # .]. "pdl": launches overlapping (programmatic dependent launch, Hopper and later).
    # A fifth number is the preload: chunks of weights read before the launch waits for its predecessor.
    "int4": [((16, 1024, 8), (2, 256, 2, 3, 3), "pdl"), ((16, 1024, 8), (4, 512, 4, 3, 2), "pdl"),
             ((16, 1024, 8), (2, 256, 2), "pdl"), ((16, 1024, 8), (4, 256, 2), "pdl"),
             ((32, 512, 8), (4, 256, 2), "pdl"), ((16, 512, 4), (4, 256, 2), "pdl"),
             ((8, 512, 4), (2, 512, 4), "pdl"), ((16, 1024, 8), (2, 512, 4), "pdl"),
             ((16, 512, 4), (2, 256, 2), "pdl"), ((16, 1024, 8), (4, 256, 2))],
    # mxfp4 block_k counts elements, whole 32-value groups; the first pair is the shipped setting
    "mxfp4": [((8, 1024, 4), (4, 256, 4)), ((4, 1024, 4), (4, 256, 4)), ((16, 1024, 8), (4, 256, 4)),
              ((8, 512, 4), (4, 512, 4)), ((8, 1024, 4), (2, 256, 4)), ((8, 1024, 8), (8, 256, 4)),
              ((4, 512, 4), (2, 512, 4)), ((16, 1024, 8), (2, 1024, 4), "pdl"), ((16, 512, 4), (2, 1024, 4), "pdl"),
              ((8, 1024, 4), (4, 256, 4), "pdl"), ((16, 1024, 8), (4, 512, 4), "pdl"),
              ((32, 512, 8), (2, 1024, 4), "pdl"), ((16, 1024, 8), (2, 512, 2, 3, 2), "pdl"),
              ((8, 512, 4), (2, 1024, 4), "pdl"), ((32, 1024, 8), (4, 1024, 8), "pdl"),
              ((16, 2048, 8), (2, 1024, 4), "pdl")],
}
# Prefill candidates: (block_m, block_n, block_k, num_warps, num_stages[, "join"]): the same tile for up and
# down; 4 warps on a 64 x 64 tile spill registers on sm_90 (255 used), 8 do not; "join" (int4 only): tiles
# of joined nibbles (kernels/moe_prefill.py)
PREFILL_TILES = [(16, 64, 64, 4, 3), (32, 64, 128, 4, 3), (64, 64, 64, 4, 3), (64, 64, 64, 8, 3),
                 (64, 128, 64, 8, 3), (32, 64, 128, 8, 3), (128, 64, 64, 8, 3)]


def time_graph(fn, iters: int = 30) -> float:
    """Median milliseconds of one replay of a CUDA graph capturing ``fn``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_eager(fn, iters: int = 10) -> float:
    """Median milliseconds of ``fn`` run eagerly (for paths that sync and cannot be captured)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_ceiling_gbs() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), in GB/s."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_eager(lambda: dst.copy_(src), iters=20)
    del src, dst
    return 2 * (2 << 30) / ms / 1e6


def build_layers(shape: Shape, fmt: str, layers: int) -> tuple[ExpertLayout, list[dict], list[torch.Tensor]]:
    """``layers`` pools of all E experts (one quantised layer, copied), with a scrambled slot table."""
    E, TOP_K, D, F, GROUP = astuple(shape)
    layout = ExpertLayout.make(fmt, D, F, GROUP)
    g = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.empty(E, layout.nbytes, dtype=torch.uint8, device="cuda")
    for e in range(E):
        w13 = torch.randn(2 * F, D, device="cuda", generator=g) * 0.02
        w2 = torch.randn(D, F, device="cuda", generator=g) * 0.02
        layout.pack(quantize_expert(w13, w2, layout), buf[e])
    perm = torch.randperm(E, device="cuda", generator=g)
    bufs = [buf[perm].clone() for _ in range(layers)]                    # slot s holds expert inv[s]
    slots = torch.empty(E, dtype=torch.int32, device="cuda")
    slots[perm] = torch.arange(E, dtype=torch.int32, device="cuda")
    return layout, [layout.views(b) for b in bufs], [slots] * layers


def expert_bytes(layout: ExpertLayout) -> int:
    return sum(s.nbytes for s in layout.tensors)


def routing(shape: Shape, tokens: int, layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    E, TOP_K, D, F, GROUP = astuple(shape)
    out = []
    for i in range(layers):
        logits = torch.randn(tokens, E, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i))
        out.append(route(logits, TOP_K, "softmax", True))
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def check_small_kernels(shape: Shape) -> dict:
    """Router and alignment on the GPU against their references, and torch.topk's tie order on CUDA."""
    E, TOP_K, D, F, GROUP = astuple(shape)
    logits = torch.randn(64, E, device="cuda")
    w, ids = route(logits, TOP_K, "softmax", True)
    w_r, ids_r = route_ref(logits, TOP_K, "softmax", True)
    ties = torch.zeros(4, E, device="cuda")
    ties[:, 5] = ties[:, 9] = 1.0
    ids_t = torch.topk(torch.softmax(ties, -1), TOP_K).indices.to(torch.int32)
    slots = torch.randperm(E, device="cuda").to(torch.int32)
    a, r = moe_align(ids, slots, 16), moe_align_ref(ids, slots, 16)
    return {"router_ids_equal": bool(torch.equal(ids, ids_r)), "router_weight_err": rel_err(w, w_r),
            "router_ties_equal_cuda_topk": bool(torch.equal(route(ties, TOP_K)[1], ids_t)),
            "align_equal": all(torch.equal(getattr(a, n), getattr(r, n)) for n in
                               ("sorted_pairs", "block_expert", "block_slot", "num_padded"))}


def config_of(tile: tuple, tokens: int) -> MoeLaunchConfig:
    if len(tile) == 3 and tile[2] == "pdl":  # decode, launches overlapping
        return MoeLaunchConfig("decode", TileConfig(*tile[0]), TileConfig(*tile[1]), pdl=True)
    if len(tile) == 2:
        return MoeLaunchConfig("decode", TileConfig(*tile[0]), TileConfig(*tile[1]))
    m, n, k, w, s, *join = tile
    return MoeLaunchConfig("prefill", TileConfig(n, k, w, s), TileConfig(n, k, w, s), m, join=join == ["join"])


def bench_format(shape: Shape, fmt: str, layers: int, tokens: tuple[int, ...]) -> tuple[list[dict], dict]:
    """Correctness, sweep and timings of one format; returns rows and the tuned table entries."""
    E, TOP_K, D, F, GROUP = astuple(shape)
    layout, views, slots = build_layers(shape, fmt, layers)
    x = [torch.randn(max(tokens), D, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    rows, tuned = [], {}
    for t in tokens:
        routes = routing(shape, t, layers)
        touched = [int(torch.unique(ids).numel()) for _, ids in routes]
        nbytes = statistics.mean(touched) * expert_bytes(layout) + 2 * t * D * 2
        ref = fused_moe_ref(x[0][:t], routes[0][1], routes[0][0], slots[0], views[0], layout)
        best = best16 = None
        tiles = DECODE_TILES[fmt] if t <= 16 else PREFILL_TILES + (
            [(*tile, "join") for tile in PREFILL_TILES] if fmt == "int4" else [])
        # the engine's 4-bit decode takes x's planes from the norm, in groups of the experts' own size
        x16 = [act16(x[i][:t], layout.group_size) for i in range(layers)] if fmt in ("int4", "mxfp4") and t <= 16 \
            else None
        sweep = []
        for tile in tiles:
            cfg = config_of(tile, t)
            try:
                out = fused_moe(x[0][:t], routes[0][1], routes[0][0], slots[0], views[0], layout, cfg)
                err = rel_err(out, ref)
                ms = time_graph(lambda: [fused_moe(x[i][:t], routes[i][1], routes[i][0], slots[i], views[i],
                                                   layout, cfg) for i in range(layers)]) / layers
            except Exception as ex:  # noqa: BLE001 - one failing setting must not end the sweep
                sweep.append({"tile": tile, "error": f"{type(ex).__name__}: {ex}"[:300]})
                continue
            entry = {"tile": tile, "ms": ms, "rel_err_vs_ref": err}
            if x16 is not None:  # x's planes written by the norm before the router: up and down only
                entry["ms_x_from_norm"] = time_graph(lambda: [fused_moe(
                    x[i][:t], routes[i][1], routes[i][0], slots[i], views[i], layout, cfg, x16=x16[i])
                    for i in range(layers)]) / layers
                if err < 2e-2 and (best16 is None or entry["ms_x_from_norm"] < best16[0]):
                    best16 = (entry["ms_x_from_norm"], tile)
            sweep.append(entry)
            if err < 2e-2 and (best is None or ms < best[0]):
                best = (ms, tile, err)
        ms_again = None
        if best:  # the same setting timed twice: the spread between runs
            cfg = config_of(best[1], t)
            ms_again = time_graph(lambda: [fused_moe(x[i][:t], routes[i][1], routes[i][0], slots[i], views[i],
                                                     layout, cfg) for i in range(layers)]) / layers
        # the plain-torch reference (what the engine runs without Triton), timed eagerly
        ref_ms = time_eager(lambda: fused_moe_ref(x[0][:t], routes[0][1], routes[0][0], slots[0], views[0], layout))
        row = {"format": fmt, "tokens": t, "experts_touched": statistics.mean(touched), "bytes": nbytes,
               "ms": best[0] if best else None, "ms_again": ms_again, "tile": best[1] if best else None,
               "rel_err_vs_ref": best[2] if best else None, "torch_ref_ms": ref_ms, "sweep": sweep}
        if best16:  # timed again, and the norm that writes the planes timed with and without them
            cfg = config_of(best16[1], t)
            row.update(ms_x_from_norm=best16[0], tile_x_from_norm=best16[1],
                       **norm_cost(shape, x, t, layers, layout.group_size),
                       ms_x_from_norm_again=time_graph(lambda: [fused_moe(
                           x[i][:t], routes[i][1], routes[i][0], slots[i], views[i], layout, cfg, x16=x16[i])
                           for i in range(layers)]) / layers)
        rows.append(row)
        if best16 or best:  # the engine's 4-bit decode takes x from the norm: tune for that
            c = config_of(best16[1] if best16 else best[1], t)
            tuned[str(t)] = {"variant": c.variant, "block_m": c.block_m, "up": vars(c.up), "down": vars(c.down),
                             "pdl": c.pdl, **({"join": c.join} if c.variant == "prefill" and fmt == "int4" else {})}
        print(f"{fmt} T={t}: {row}", flush=True)
    return rows, tuned


def norm_cost(shape: Shape, x: list[torch.Tensor], t: int, layers: int, group: int) -> dict:
    """Milliseconds of the add + RMSNorm before the router (bf16, ``layers`` of them in a graph, per
    layer) without and with writing x's 16-bit planes (groups of ``group``): what moving the planes there
    costs."""
    D, GROUP = shape.hidden, group
    g = torch.Generator(device="cuda").manual_seed(1)
    w = (1 + 0.1 * torch.randn(D, device="cuda", generator=g)).bfloat16()
    r = [torch.randn(t, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(layers)]
    plain = time_graph(lambda: [add_rms_norm(x[i][:t], w, 1e-6, residual=r[i]) for i in range(layers)]) / layers
    planes = time_graph(lambda: [add_rms_norm_act16(x[i][:t], w, 1e-6, GROUP, residual=r[i])
                                 for i in range(layers)]) / layers
    return {"norm_ms": plain, "norm_act16_ms": planes}


def grouped_mm_bf16(shape: Shape, layers: int, tokens: tuple[int, ...]) -> dict:
    """``torch._grouped_mm`` bf16 MoE (dense per-expert weights [E, K, N]) timed like the kernels."""
    E, TOP_K, D, F, GROUP = astuple(shape)
    if not hasattr(torch, "_grouped_mm"):
        return {}
    w13 = [torch.randn(E, D, 2 * F, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    w2 = [torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    res = {}
    for t in tokens:
        routes = routing(shape, t, layers)
        x = torch.randn(t, D, device="cuda", dtype=torch.bfloat16)

        def layer(i):
            w, ids = routes[i]
            flat = ids.flatten().long()
            order = torch.argsort(flat, stable=True)
            counts = torch.zeros(E, dtype=torch.int32, device="cuda").scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            xs = x[order // TOP_K]
            h = torch._grouped_mm(xs, w13[i], offs=offs)
            h = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
            y = torch._grouped_mm(h, w2[i], offs=offs) * w.flatten()[order, None].to(h.dtype)
            return torch.zeros(t, D, device="cuda", dtype=y.dtype).index_add_(0, order // TOP_K, y)
        try:
            res[str(t)] = time_graph(lambda: [layer(i) for i in range(layers)]) / layers
        except Exception as ex:  # noqa: BLE001 - report, do not hide, a missing backend
            res[str(t)] = f"failed: {type(ex).__name__}: {ex}"[:200]
            break
    return res


def environment(commit: str, shape_name: str) -> dict:
    import triton
    drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "gpu": torch.cuda.get_device_name(), "driver": drv, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "shape": {"name": shape_name, **asdict(SHAPES[shape_name])}}


def parse_args() -> tuple[argparse.Namespace, tuple[str, ...], tuple[int, ...]]:
    """Command line, with ``--formats`` and ``--tokens`` as tuples (a short run covers fewer cases)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs-out", help="tuned table; complete only when all formats and tokens run")
    ap.add_argument("--commit", default="unknown", help="commit measured (the device copy has no .git)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--grouped-mm", action=argparse.BooleanOptionalAction, default=True,
                    help="also time torch._grouped_mm (bf16), as transformers' grouped_mm experts run")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {', '.join(FORMATS)}")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma list of token counts")
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES), help="the layers' shape")
    args = ap.parse_args()
    formats = tuple(f for f in args.formats.split(",") if f)
    if not formats or set(formats) - set(FORMATS):
        ap.error(f"--formats takes a comma list of {', '.join(FORMATS)}, got {args.formats!r}")
    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    except ValueError:
        tokens = ()
    if not tokens or min(tokens) < 1:
        ap.error(f"--tokens takes a comma list of positive token counts, got {args.tokens!r}")
    return args, formats, tokens


def main() -> None:
    args, formats, tokens = parse_args()
    shape = SHAPES[args.shape]
    result = {**environment(args.commit, args.shape), "ceiling_gbs": copy_ceiling_gbs()}
    result["small_kernels"] = check_small_kernels(shape)
    print(result, flush=True)
    rows, tuned = [], {}
    for fmt in formats:
        r, tuned[fmt] = bench_format(shape, fmt, args.layers, tokens)
        rows += r
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps({**result, "results": rows}, indent=1))  # partial, if cut short
    result["grouped_mm_bf16_ms"] = grouped_mm_bf16(shape, args.layers, tokens) if args.grouped_mm else {}
    for r in rows:
        r["gbs"] = r["bytes"] / r["ms"] / 1e6 if r["ms"] else None
        r["pct_ceiling"] = 100 * r["gbs"] / result["ceiling_gbs"] if r["gbs"] else None
        if r.get("ms_x_from_norm"):  # the MoE alone, and with what the norm's planes add to the norm
            r["pct_ceiling_x_from_norm"] = 100 * r["bytes"] / r["ms_x_from_norm"] / 1e6 / result["ceiling_gbs"]
            extra = max(0.0, r["norm_act16_ms"] - r["norm_ms"])
            r["pct_ceiling_x_from_norm_with_norm_cost"] = (100 * r["bytes"] / (r["ms_x_from_norm"] + extra) / 1e6
                                                          / result["ceiling_gbs"])
        for v in r["sweep"]:
            v["pct_ceiling"] = 100 * r["bytes"] / v["ms"] / 1e6 / result["ceiling_gbs"] if "ms" in v else None
    result["results"] = rows
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.configs_out:
        Path(args.configs_out).write_text(json.dumps(tuned, indent=1))
    print(f"\nceiling {result['ceiling_gbs']:.0f} GB/s  {result['small_kernels']}")
    print(f"{'fmt':5} {'T':>3} {'us':>8} {'again':>7} {'GB/s':>7} {'%ceil':>6} {'err':>8} {'gmm us':>8} {'ref us':>8}"
          "  tile")
    for r in rows:
        g = result["grouped_mm_bf16_ms"].get(str(r["tokens"])) if r["format"] == "bf16" else None
        gs = f"{1000 * g:8.1f}" if isinstance(g, float) else f"{'-':>8}"
        if r["ms"] is None:
            print(f"{r['format']:5} {r['tokens']:3}  no correct setting")
            continue
        print(f"{r['format']:5} {r['tokens']:3} {1000 * r['ms']:8.1f} {1000 * r['ms_again']:7.1f} {r['gbs']:7.0f} "
              f"{r['pct_ceiling']:6.1f} {r['rel_err_vs_ref']:8.1e} {gs} {1000 * r['torch_ref_ms']:8.1f}  {r['tile']}")
        if r.get("ms_x_from_norm"):
            print(f"{'':5} {'':3} {1000 * r['ms_x_from_norm']:8.1f} {1000 * r['ms_x_from_norm_again']:7.1f} "
                  f"{'':7} {r['pct_ceiling_x_from_norm']:6.1f}  x from the norm; norm {1000 * r['norm_ms']:.2f} -> "
                  f"{1000 * r['norm_act16_ms']:.2f} us, with it {r['pct_ceiling_x_from_norm_with_norm_cost']:.1f}%"
                  f"  {r['tile_x_from_norm']}")


if __name__ == "__main__":
    main()
