"""Engine flags shared by every subcommand, and their translation into EngineConfig options."""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from engine.config import DTYPES, EXPERT_POLICIES, EXPERT_READS, KV_DTYPES, WEIGHT_FORMATS
from engine.cpu_threads import threads_from_env

REPO = Path(__file__).resolve().parents[2]
DEMO_MODEL = REPO / "resources" / "models" / "demo"


def add_model_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (Hugging Face or converted); default: the bundled demo")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help="activation and resident weight dtype")
    g.add_argument("--weight-format", default="auto", choices=WEIGHT_FORMATS,
                   help="routed expert format; int4/fp8 quantise at load (default: as stored)")
    g.add_argument("--group-size", type=int, default=128, help="int4 group size along K: 32, 64 or 128")
    g.add_argument("--expert-pool-size", default=None,
                   help="GPU expert pool: bytes, e.g. 10G, or a share of the experts, e.g. 50%% (default: every expert that fits)")
    g.add_argument("--prefetch-depth", type=int, default=2, help="MoE layers to prefetch ahead (0 = off)")
    g.add_argument("--expert-policy", default="adaptive", choices=EXPERT_POLICIES, help="pool eviction policy")
    g.add_argument("--expert-reads", default="auto", choices=EXPERT_READS,
                   help="missing experts of decode steps: read from host memory (direct) or copied in first")
    g.add_argument("--routing-profile", default=None, help="routing profile JSON for --expert-policy static")
    g.add_argument("--record-routing", default=None, help="write a routing profile JSON on exit")
    g.add_argument("--max-batch", type=int, default=16, help="requests decoded together")
    g.add_argument("--max-batch-tokens", type=int, default=None, help="token budget per step")
    g.add_argument("--prefill-chunk", type=int, default=2048, help="longest prompt slice per step")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length, at most the model's (default: the model's)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=KV_DTYPES, help="KV cache storage")
    g.add_argument("--kv-cache-size", default=None,
                   help="KV cache bytes, e.g. 2G (default: what the GPU budget leaves; 256M on the CPU)")
    g.add_argument("--gpu-memory-budget", default=None, help="GPU bytes Strata may use, e.g. 24G (default: free)")
    g.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="capture decode steps in CUDA graphs (default: on a CUDA GPU)")
    g.add_argument("--cpu-threads", type=int, default=None,
                   help="threads of the CPU math (default: OMP_NUM_THREADS if set, else chosen by model size)")
    g.add_argument("--verify", action="store_true",
                   help="check a converted folder's checksums again, even if an earlier load verified them")


def model_dir(args: argparse.Namespace) -> str:
    return str(args.model) if args.model else str(DEMO_MODEL)


def engine_options(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> dict:
    """EngineConfig keyword arguments from parsed flags (model excluded).

    The CPU thread count a user set for OpenMP (``OMP_NUM_THREADS``) counts as ``--cpu-threads``.
    """
    keys = ("device", "dtype", "weight_format", "group_size", "expert_pool_size", "prefetch_depth", "expert_policy",
            "expert_reads", "routing_profile", "record_routing", "max_batch", "max_batch_tokens", "prefill_chunk", "max_model_len",
            "kv_cache_dtype", "kv_cache_size", "gpu_memory_budget", "cuda_graphs", "cpu_threads", "verify")
    options = {k: getattr(args, k) for k in keys if hasattr(args, k)}
    if "cpu_threads" in options and options["cpu_threads"] is None:
        options["cpu_threads"] = threads_from_env(environ)
    return options
