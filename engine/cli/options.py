"""Engine flags shared by every subcommand, and their translation into EngineConfig options."""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from engine.config import DTYPES, EMBEDDINGS, RESIDENT_WEIGHTS, WEIGHT_FORMATS, EngineConfig
from engine.cpu_threads import threads_from_env
from engine.errors import ConfigError
from engine.options import option

REPO = Path(__file__).resolve().parents[2]
DEMO_MODEL = REPO / "resources" / "models" / "demo"


def utf8_text(value: str) -> str:
    """An argument that is text: the bytes the shell gave must be UTF-8 (Python keeps others as lone surrogates,
    which no tokenizer takes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("is not UTF-8 text; set the terminal to UTF-8 (e.g. LANG=C.UTF-8) and "
                                         "give it again") from None
    return value


def add_model_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (Hugging Face or converted); default: the bundled demo")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def _live_flag(g: argparse._ArgumentGroup, name: str) -> None:
    """The flag of a live option, from its entry in engine.options (EngineConfig checks the value)."""
    o = option(name)
    flag, text = "--" + name.replace("_", "-"), o.help.replace("%", "%%")
    if o.kind == "bool":
        g.add_argument(flag, action=argparse.BooleanOptionalAction, default=_DEFAULTS[name], help=text)
    elif o.kind == "choice":
        g.add_argument(flag, default=_DEFAULTS[name], choices=o.choices, help=text)
    elif o.kind == "int":
        g.add_argument(flag, type=int, default=_DEFAULTS[name], help=text)
    else:
        g.add_argument(flag, default=_DEFAULTS[name], help=text)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help="activation and resident weight dtype")
    g.add_argument("--weight-format", default="auto", choices=WEIGHT_FORMATS,
                   help="routed expert format; int4/fp8 quantise at load (default: as stored)")
    g.add_argument("--group-size", type=int, default=128,
                   help="int4 group size along K: 32, 64 or 128 (default: 128, or the largest of them that divides "
                        "the model's expert widths)")
    g.add_argument("--resident-weights", default="auto", choices=RESIDENT_WEIGHTS,
                   help="attention, dense MLPs and LM head on the GPU: fp8 / int8 halve the bytes a token reads "
                        "(default: as stored; fp8 beside experts quantised at load on a GPU that runs it)")
    g.add_argument("--embeddings", default="auto", choices=EMBEDDINGS,
                   help="token embedding table: host keeps it off the GPU, which reads one row per token "
                        "(default: host on a GPU when experts are offloaded)")
    for name in ("expert_pool_size", "prefetch_depth", "expert_policy", "expert_reads", "cold_experts"):
        _live_flag(g, name)
    g.add_argument("--routing-profile", default=None, help="routing profile JSON for --expert-policy static")
    g.add_argument("--record-routing", default=None, help="write a routing profile JSON on exit")
    for name in ("max_batch", "max_batch_tokens", "prefill_chunk"):
        _live_flag(g, name)
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length, at most the model's (default: the model's)")
    _live_flag(g, "kv_cache_dtype")
    g.add_argument("--kv-cache-size", default=None,
                   help="KV cache bytes, e.g. 2G (default: what the GPU budget leaves, 256M on the CPU; either way no "
                        "more than a full batch at the context length fills)")
    g.add_argument("--gpu-memory-budget", default=None, help="GPU bytes Strata may use, e.g. 24G (default: free)")
    _live_flag(g, "cuda_graphs")
    g.add_argument("--overlap-steps", action=argparse.BooleanOptionalAction, default=True,
                   help="launch each decode step before reading the last one's tokens back, where every request "
                        "decodes and every expert is on the GPU (default: on)")
    g.add_argument("--cpu-threads", type=int, default=None,
                   help="threads of the CPU math (default: OMP_NUM_THREADS if set, else chosen by model size)")
    g.add_argument("--pipeline-parallel", type=int, default=1, metavar="N",
                   help="split the layers over N GPUs of this host, one process and one expert pool each; "
                        "--gpu-memory-budget is then the cards' total, or one size per card (24G,20G) (default: 1)")
    g.add_argument("--pipeline-microbatches", type=int, default=None, metavar="M",
                   help="send a pipeline's steps down the stages in M groups of sequences, so that the cards work "
                        "at once (default: one per stage for decode steps on GPUs, 1 on the CPU)")
    g.add_argument("--expert-parallel", type=int, default=1, metavar="N",
                   help="spread every MoE layer's experts over N GPUs of this host, each with its own pool and link "
                        "to host memory; the first GPU holds the rest of the model (default: 1)")
    g.add_argument("--verify", action="store_true",
                   help="check a converted folder's checksums again, even if an earlier load verified them")


def model_dir(args: argparse.Namespace) -> str:
    """The model folder: ``--model``, else the bundled demo. An empty ``--model`` (an unset variable in
    ``--model "$MODEL"``) is refused rather than taken as "not given"."""
    if args.model is None:
        return str(DEMO_MODEL)
    if not str(args.model).strip():
        raise ConfigError("--model is empty; give a model folder, or leave --model out for the bundled demo")
    return str(args.model)


def engine_options(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> dict:
    """EngineConfig keyword arguments from parsed flags (model excluded).

    The CPU thread count a user set for OpenMP (``OMP_NUM_THREADS``) counts as ``--cpu-threads``.
    """
    keys = ("device", "dtype", "weight_format", "group_size", "resident_weights", "embeddings", "expert_pool_size", "prefetch_depth", "expert_policy",
            "expert_reads", "cold_experts", "routing_profile", "record_routing", "max_batch", "max_batch_tokens", "prefill_chunk", "max_model_len",
            "kv_cache_dtype", "kv_cache_size", "gpu_memory_budget", "cuda_graphs", "overlap_steps", "cpu_threads", "verify",
            "pipeline_parallel", "pipeline_microbatches", "expert_parallel")
    options = {k: getattr(args, k) for k in keys if hasattr(args, k)}
    if "cpu_threads" in options and options["cpu_threads"] is None:
        options["cpu_threads"] = threads_from_env(environ)
    return options
