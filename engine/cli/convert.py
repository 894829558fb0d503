"""``convert`` and ``eval`` subcommands."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.cli.options import engine_options, model_dir
from engine.config import EngineConfig
from engine.errors import ConfigError


def add_convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="write a model with int4/fp8/bf16 experts laid out expert-contiguous")
    p.add_argument("src", help="Hugging Face model folder")
    p.add_argument("dst", help="folder to write")
    p.add_argument("--weights", default="int4", help="routed expert format: int4 | fp8 | bf16 (default int4)")
    p.add_argument("--group-size", type=int, default=128, help="int4 group size along K: 32, 64 or 128")
    p.add_argument("--resident-weights", default="bf16", help="storage of the other weights: bf16 | fp8")
    p.add_argument("--force", action="store_true", help="overwrite an existing destination")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def add_eval_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("eval", help="perplexity on a text file, and agreement with a reference model")
    add_model_flag(p)
    p.add_argument("--text", required=True, help="UTF-8 text file")
    p.add_argument("--reference", default=None, help="reference model folder (e.g. the unquantised source)")
    p.add_argument("--window", type=int, default=256, help="tokens per scored window")
    p.add_argument("--max-tokens", type=int, default=None, help="score at most this many tokens")
    p.add_argument("--json", action="store_true")
    add_engine_flags(p)


def cmd_convert(args: argparse.Namespace) -> int:
    from engine.checkpoint.convert import bar, convert
    dst = convert(args.src, args.dst, args.weights, args.group_size, args.resident_weights, args.force, bar)
    manifest = json.loads((Path(dst) / "strata.json").read_text())
    size = sum(f.stat().st_size for f in Path(dst).iterdir() if f.is_file())
    print(f"wrote {dst}: {manifest['weights']} experts (group {manifest['group_size']}), "
          f"{manifest['num_moe_layers']} MoE layers x {manifest['num_experts']} experts, {size / 2**20:.1f} MiB, verified")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.engine import LLMEngine
    from engine.evaluate import evaluate
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read --text {args.text} ({e}); give a UTF-8 text file")
    opts = engine_options(args)
    engine = LLMEngine(EngineConfig(model=model_dir(args), **opts))
    ref = LLMEngine(EngineConfig(model=args.reference, **{**opts, "weight_format": "auto"})) if args.reference else None
    r = evaluate(engine, text, ref, args.window, args.max_tokens)
    if args.json:
        print(json.dumps(r.__dict__))
        return 0
    print(f"tokens {r.tokens}  perplexity {r.perplexity:.3f}")
    if ref is not None:
        print(f"reference perplexity {r.reference_perplexity:.3f} ({100 * (r.perplexity / r.reference_perplexity - 1):+.2f}%)"
              f"  top-1 agreement {100 * r.top1_agreement:.2f}%  logit cosine {r.mean_cosine:.4f}")
    return 0
