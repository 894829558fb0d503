"""``convert`` and ``eval`` subcommands."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.cli.options import engine_options, model_dir
from engine.config import EngineConfig
from engine.errors import ConfigError, StrataError


def add_convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="write a model with int4/fp8/bf16/mxfp4 experts laid out expert-contiguous")
    p.add_argument("src", help="Hugging Face model folder")
    p.add_argument("dst", help="folder to write")
    p.add_argument("--weights", default="auto",
                   help="routed expert format: auto | int4 | fp8 | bf16 | mxfp4 (default auto: MXFP4 experts stay "
                        "as shipped, others become int4)")
    p.add_argument("--group-size", type=int, default=None,
                   help="int4 group size along K: 32, 64 or 128 (default: the largest that divides the model's widths)")
    p.add_argument("--resident-weights", default="bf16", help="storage of the other weights: bf16 | fp8 | int8 (8 bits stay 8 bits on the GPU)")
    p.add_argument("--force", action="store_true", help="replace DST if it holds an earlier conversion")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def add_eval_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("eval", help="perplexity on a text file, and agreement with a reference model")
    add_model_flag(p)
    p.add_argument("--text", required=True, help="UTF-8 text file")
    p.add_argument("--reference", default=None, help="reference model folder (e.g. the unquantised source)")
    p.add_argument("--window", type=int, default=256, help="tokens per scored window (at least 2)")
    p.add_argument("--max-tokens", type=int, default=None, help="score at most this many tokens (at least 2)")
    p.add_argument("--json", action="store_true")
    add_engine_flags(p)


class ProgressBar:
    """A one-line progress bar on stderr, drawn only on a terminal; ``clear`` wipes it before an error line."""

    def __init__(self, verb: str, in_bytes: bool = False) -> None:
        self.verb, self.in_bytes, self.drawn = verb, in_bytes, False

    def __call__(self, done: int, total: int, label: str) -> None:
        if not sys.stderr.isatty():
            return
        width = 30
        fill = width * done // max(total, 1)
        count = f"{done / 2**30:.1f}/{total / 2**30:.1f} GiB" if self.in_bytes else f"{done}/{total}"
        sys.stderr.write(f"\r{self.verb} [{'#' * fill}{'.' * (width - fill)}] {count} {label:<24}")
        self.drawn = done < total
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.drawn = False


def cmd_convert(args: argparse.Namespace) -> int:
    progress = ProgressBar("converting")
    try:
        from engine.checkpoint.convert import convert
        result = convert(args.src, args.dst, args.weights, args.group_size, args.resident_weights, args.force, progress)
    except StrataError:
        progress.clear()
        raise
    except KeyboardInterrupt as e:      # Ctrl-C: one line saying what DST holds now (convert's text, once it has one)
        progress.clear()
        print(f"note: {e or f'interrupted; nothing was written to {args.dst}'}", file=sys.stderr)
        return 130
    m = result.manifest
    size = sum(f.stat().st_size for f in result.path.iterdir() if f.is_file())
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    group = f" (group {m['group_size']})" if m["weights"] == "int4" else ""
    kept = ", as shipped" if m["weights"] == m["source_experts"] == "mxfp4" else ""
    print(f"wrote {args.dst}: {m['weights']} experts{group}{kept}, "
          f"{m['num_moe_layers']} MoE layers x {m['num_experts']} experts, {size / 2**20:.1f} MiB, verified")
    return 0


FEW_TOKENS = 100     # eval: below this many scored tokens a perplexity is noted as saying little


def _read_text(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--text {path} does not exist; give a UTF-8 text file")
    if p.is_dir():
        raise ConfigError(f"--text {path} is a folder; give a UTF-8 text file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--text {path} is not UTF-8 text (byte {e.start} cannot be decoded); save it as UTF-8")
    except OSError as e:
        raise ConfigError(f"cannot read --text {path} ({e.strerror}); give a UTF-8 text file you can read")


def _check_eval_args(args: argparse.Namespace) -> None:
    """Everything that needs no model, checked before one is loaded."""
    if args.window < 2:
        raise ConfigError(f"--window {args.window} is too small; a window scores its tokens after the first, so give "
                          "at least 2 (default 256)")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ConfigError(f"--max-tokens {args.max_tokens} is too small; give at least 2, or leave it out to score "
                          "the whole text")
    ref = args.reference
    if ref is not None and not Path(ref).is_dir():
        what = "is a file" if Path(ref).exists() else "does not exist"
        raise ConfigError(f"--reference {ref} {what}; give the folder of the model to compare with (e.g. the "
                          "unquantised source)")


def _note_another_source(model: Path, reference: Path) -> None:
    """A note where ``model`` is a conversion of another folder than ``reference``: the agreement then
    measures how two models differ, not what the conversion lost."""
    from engine.checkpoint.converted import is_converted, manifest_source, read_manifest
    try:
        source = manifest_source(read_manifest(model)) if is_converted(model) else ""
        same = not source or Path(source).resolve() == reference.resolve()
    except (OSError, ValueError, StrataError):
        return                                   # a manifest that cannot be read is the load's to refuse
    if not same:
        print(f"note: {model} was converted from {source}, not from the reference {reference}; the agreement "
              f"compares two different models (give --reference {source} to see what the conversion lost)",
              file=sys.stderr)


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.engine import LLMEngine
    from engine.evaluate import evaluate, reference_weight_format
    _check_eval_args(args)
    if args.reference:
        _note_another_source(Path(model_dir(args)), Path(args.reference))
    text = _read_text(args.text)
    opts = engine_options(args)
    engines = [LLMEngine(EngineConfig(model=model_dir(args), **opts),
                         progress=ProgressBar("verifying checksums", in_bytes=True))]
    try:
        if args.reference:
            ref_format = reference_weight_format(args.reference)
            # the reference as stored: the flags' quantisation, dtype and KV format apply to the model under test only
            engines.append(LLMEngine(EngineConfig(model=args.reference, **{**opts, "weight_format": ref_format,
                                                                            "resident_weights": "auto", "dtype": "auto",
                                                                            "kv_cache_dtype": "auto"})))
        engine, ref = engines[0], (engines[1] if args.reference else None)
        r = evaluate(engine, text, ref, args.window, args.max_tokens)
    finally:
        for e in engines:
            e.close()
    if r.tokens < FEW_TOKENS:
        print(f"note: only {r.tokens} token{'s' if r.tokens != 1 else ''} scored; a perplexity from so few says little, "
              f"so give a text of {FEW_TOKENS} tokens or more", file=sys.stderr)
    if args.json:
        print(json.dumps(r.__dict__))
        return 0
    resident = f", {r.resident_format} resident weights" if r.resident_format != "bf16" else ""
    of = f" scored of {r.text_tokens} (each window's first is its context)" if r.text_tokens > r.tokens else ""
    print(f"tokens {r.tokens}{of}  perplexity {r.perplexity:.3f}  ({r.expert_format} experts{resident})")
    if ref is not None:
        print(f"reference perplexity {r.reference_perplexity:.3f} ({100 * (r.perplexity / r.reference_perplexity - 1):+.2f}%, "
              f"{r.reference_format} experts)  top-1 agreement {100 * r.top1_agreement:.2f}%  "
              f"logit cosine {r.mean_cosine:.4f}")
    return 0
