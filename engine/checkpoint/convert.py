"""``convert``: a Hugging Face MoE checkpoint -> Strata's converted format (see converted.py).

Streams layer by layer (one layer's experts in memory at a time), so a checkpoint larger than RAM
converts. Every path is checked before any work starts (see destination.py); every tensor is checked
for its dtype and for NaN/Inf as it is read. The conversion is written into a temporary folder (beside
the destination, or inside it where that is an empty folder) and moved into place only after every file
has been re-read and checked against the hash recorded in the manifest. Ctrl-C leaves the destination as
it was, and is held back while the conversion is moved into place so that the move is never cut in half.

A checkpoint that ships MXFP4 experts (gpt-oss) keeps them as shipped unless another format is asked for
(``weights="auto"``); int4 / fp8 / bf16 are made from its dequantised values one expert at a time.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from engine.checkpoint.checks import check_finite
from engine.checkpoint.fp8_blocks import with_fp8_blocks
from engine.checkpoint.converted import (FORMAT_VERSION, MANIFEST, RESIDENT_FILE, ROW_SCALES, expert_doc, expert_file,
                                         layout_doc, verify_files)
from engine.checkpoint.destination import (PARTIAL_MARKER, STAGING, Destination, Staging, check_source, discard,
                                           install, make_staging, plan_destination)
from engine.checkpoint.integrity import RECORD, file_sha256
from engine.checkpoint.loader import check_complete, pack_layer_experts, where_of
from engine.checkpoint.plan import kept_in_float32, quantisable, tensor_plan
from engine.checkpoint.reader import INDEX, SafetensorsReader
from engine.checkpoint.spec import ModelSpec, read_spec
from engine.config import DEFAULT_GROUP_SIZE, GROUP_SIZES
from engine.errors import ConfigError, ModelLoadError, StrataError
from engine.file_modes import as_new_file, umask
from kernels.expert_layout import ExpertLayout
from engine.loading import expert_act
from engine.placement import fitting_group
from engine.tokenizer import Tokenizer
from kernels.quant.mxfp4 import MXFP4_GROUP

EXPERT_FORMATS = ("int4", "fp8", "bf16", "mxfp4")
RESIDENT_FORMATS = ("bf16", "fp8", "int8")
# weights in other formats, which the conversion replaces: never copied across
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class ConvertOptions:
    weights: str = "auto"         # routed expert format; auto: mxfp4 for an MXFP4 source, else int4
    group_size: int = DEFAULT_GROUP_SIZE   # int4 group along K
    resident: str = "bf16"        # storage of every other weight


@dataclass(frozen=True)
class ConvertResult:
    path: Path                    # the converted folder, symbolic links resolved
    manifest: dict
    notes: tuple[str, ...] = ()   # one line each, for the user (an earlier conversion left behind)


class ConvertInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``convert``; its text says, in one line, what the destination holds now."""


def source_fingerprint(src: Path, reader: SafetensorsReader) -> str:
    """SHA-256 over config.json and every shard's name, size and safetensors header (cheap for huge models)."""
    h = hashlib.sha256((src / "config.json").read_bytes())
    for f in sorted({reader.file_of(n) for n in reader.names()}):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            h.update(f.name.encode() + str(f.stat().st_size).encode() + fh.read(n))
    return h.hexdigest()


def _check_options(opts: ConvertOptions) -> None:
    if opts.weights != "auto" and opts.weights not in EXPERT_FORMATS:
        raise ConfigError(f"--weights {opts.weights!r} is not a known format; choose auto (MXFP4 experts stay as "
                          "shipped, others become int4), int4, fp8, bf16 or mxfp4")
    if opts.resident not in RESIDENT_FORMATS:
        raise ConfigError(f"--resident-weights {opts.resident!r} is not a known format; choose bf16, fp8 or int8")
    if opts.group_size is not None and opts.group_size not in GROUP_SIZES:
        raise ConfigError(f"--group-size {opts.group_size} is not supported; choose 32, 64 or 128")


def _resident_tensors(reader: SafetensorsReader, spec: ModelSpec, resident: str) -> dict[str, torch.Tensor]:
    from kernels.qlinear import quantize_rows
    out: dict[str, torch.Tensor] = {}
    for t in tensor_plan(spec):
        if t.category == "routed_experts":
            continue
        w = reader.get(t.name)
        check_finite(w, t.name, where_of(reader, t.name))
        if kept_in_float32(spec, t):                 # read in float32 at load: kept so
            out[t.name] = w.to(torch.float32).contiguous()
        elif resident != "bf16" and quantisable(t):
            qw = quantize_rows(w, resident)
            out[t.name], out[t.name + ROW_SCALES[resident]] = qw.q, qw.scale
        else:
            out[t.name] = w.to(torch.bfloat16).contiguous()
    return out


def convert(src: str | Path, dst: str | Path, weights: str = "auto", group_size: int | None = None,
            resident: str = "bf16", force: bool = False, progress: Progress | None = None) -> ConvertResult:
    """Convert ``src`` into ``dst``. Raises StrataError subclasses on bad input, leaving ``dst`` as it was.

    ``weights`` "auto" keeps MXFP4 experts as shipped and makes int4 of dense ones. ``group_size`` None:
    int4's largest group (128, 64, 32) that divides the model's widths, with a note where that is not 128.
    ``force`` replaces ``dst`` only if it is an earlier conversion; nothing else is ever deleted. Ctrl-C
    raises ``ConvertInterrupted``, whose text says what ``dst`` holds.
    """
    swap = _Swap()
    try:
        return _convert(src, dst, ConvertOptions(weights, group_size, resident), force, progress, swap)
    except KeyboardInterrupt:
        raise ConvertInterrupted(_interrupted(str(dst), swap.done)) from None


@dataclass
class _Swap:
    done: bool = False            # the conversion is in place: set while Ctrl-C is held back, read after one


def _interrupted(dst: str, done: bool) -> str:
    if done:
        return f"interrupted after the conversion was moved into place; {dst} is complete"
    if (Path(dst).expanduser() / MANIFEST).is_file():
        return f"interrupted; the earlier conversion in {dst} was left as it was"
    return f"interrupted; nothing was written to {dst}"


def _convert(src: str | Path, dst: str | Path, asked: ConvertOptions, force: bool, progress: Progress | None,
             swap: _Swap) -> ConvertResult:
    _check_options(asked)
    src_dir = check_source(Path(src))
    dest = plan_destination(src_dir, Path(dst), force)
    spec = read_spec(src_dir)
    weights, group_size = asked.weights, asked.group_size
    weights = weights if weights != "auto" else ("mxfp4" if spec.expert_storage == "mxfp4" else "int4")
    unused = _unused_group(weights, group_size) if group_size is not None else ()
    chosen: tuple[str, ...] = ()
    if group_size is None and weights == "int4":
        group_size, chosen = fitting_group(spec)
    group_size = group_size if weights == "int4" and group_size is not None else DEFAULT_GROUP_SIZE
    opts = ConvertOptions(weights, group_size, asked.resident)
    _check_groups(spec, opts)
    layout = ExpertLayout.make(weights, spec.hidden, spec.moe_ffn, group_size, bias=spec.family.expert_bias,
                               act=expert_act(spec))
    reader = with_fp8_blocks(SafetensorsReader(src_dir), spec)
    check_complete(spec, reader)          # names, shapes and dtypes, before anything is written
    staging = make_staging(dest)
    try:
        manifest = _write(staging.folder, src_dir, spec, reader, layout, opts, progress)
        verify_files(staging.folder, manifest["files"])
        notes = _finish(staging, dest, src_dir, swap)
    except (OSError, SafetensorError) as e:
        discard(staging)
        raise ConfigError(_write_failed(dest, e)) from None
    except BaseException:
        discard(staging)
        raise
    return ConvertResult(dest.path, manifest, unused + chosen + notes)


def _finish(staging: Staging, dest: Destination, src: Path, swap: _Swap) -> tuple[str, ...]:
    """``install``, then the notes on the installed folder, with Ctrl-C held back so that the move into place
    is never cut in half."""
    with _ctrl_c_held():
        notes = install(staging, dest, src)
        swap.done = True
        notes += _load_problem(dest)
    return notes


@contextmanager
def _ctrl_c_held():
    """Ctrl-C (SIGINT) noted instead of handled inside the block, and delivered to the handler it had once the
    block is done; a block that raises keeps its own error. Only the main thread is ever interrupted by it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    came: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
    if came:
        signal.raise_signal(signal.SIGINT)


def _load_problem(dest: Destination) -> tuple[str, ...]:
    """What would stop a load of the converted folder that the conversion cannot see to (its weights are
    checked before any work): the tokenizer files copied from the source, read as a load reads them."""
    try:
        Tokenizer.from_dir(dest.path)
    except StrataError as e:
        return (f"loading {dest.given} would fail: {e}",)
    except (OSError, ValueError) as e:           # a file the tokenizer's reader did not expect (not UTF-8 ...)
        return (f"loading {dest.given} would fail: its tokenizer files cannot be read ({e}); copy them again from "
                "the original checkpoint",)
    return ()


def _unused_group(weights: str, group_size: int) -> tuple[str, ...]:
    if weights == "int4" or group_size == DEFAULT_GROUP_SIZE:
        return ()
    groups = "fixed groups of 32 values" if weights == "mxfp4" else "no groups"
    return (f"--group-size {group_size} applies to int4 experts only; {weights} experts have {groups}, so it was "
            "ignored",)


def _check_groups(spec: ModelSpec, opts: ConvertOptions) -> None:
    """The expert format can group this model's reduction dims (hidden for gate/up, expert FFN for down)."""
    D, F = spec.hidden, spec.moe_ffn
    if opts.weights == "mxfp4" and (D % MXFP4_GROUP or F % MXFP4_GROUP):
        raise ConfigError(f"mxfp4 experts need a hidden size and expert FFN that are multiples of {MXFP4_GROUP} "
                          f"(this model has {D} and {F}); convert with --weights int4, fp8 or bf16")
    if opts.weights != "int4" or (D % opts.group_size == 0 and F % opts.group_size == 0):
        return
    fits = [str(g) for g in sorted(GROUP_SIZES, reverse=True) if D % g == 0 and F % g == 0]
    fix = f"choose --group-size {' or '.join(fits)}" if fits else "convert with --weights fp8 or bf16"
    dim = D if D % opts.group_size else F
    raise ConfigError(f"int4 group size {opts.group_size} does not divide the reduction dim {dim} of this model's "
                      f"experts (hidden {D}, expert FFN {F}); {fix}")


_OS_ERROR = re.compile(r"\(os error (\d+)\)")      # how safetensors' Rust I/O errors name their errno
_FIXES = {errno.ENOSPC: "free disk space or choose another destination",
          errno.EDQUOT: "free disk space (or quota) or choose another destination",
          errno.EFBIG: "free disk space or choose another destination",
          errno.EROFS: "choose a destination on a writable filesystem (or remount this one read-write)",
          errno.EACCES: "choose a destination in a folder you can write to",
          errno.EPERM: "choose a destination in a folder you can write to"}


def _write_failed(dest: Destination, e: Exception) -> str:
    """One line: the cause, where, and a fix that answers that cause."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
    where = f" ({e.filename})" if isinstance(e, OSError) and e.filename else ""
    found = _OS_ERROR.search(str(e))
    code = e.errno if isinstance(e, OSError) else (int(found.group(1)) if found else None)
    if code == errno.EBUSY and dest.force:      # renaming the earlier conversion aside
        fix = (f"{dest.given} cannot be renamed (a mount point, or in use); delete the earlier conversion's files "
               "from it and convert into it without --force, or choose another destination")
    else:
        fix = _FIXES.get(code, "choose another destination")
    return f"writing the conversion for {dest.given} failed: {why}{where}; {fix} — {dest.given} was left as it was"


def _save(tensors: dict, path: Path) -> None:
    """``save_file``, with the file's permissions those of any new file (safetensors makes its files
    readable by their owner only; a converted model is shared like the checkpoint it came from)."""
    save_file(tensors, path)
    as_new_file(path)


def _write(out: Path, src: Path, spec: ModelSpec, reader: SafetensorsReader, layout: ExpertLayout,
           opts: ConvertOptions, progress: Progress | None) -> dict:
    """Write every file of the conversion into ``out``; returns the manifest written."""
    files: dict[str, str] = {}
    _save(_resident_tensors(reader, spec, opts.resident), out / RESIDENT_FILE)
    files[RESIDENT_FILE] = file_sha256(out / RESIDENT_FILE)
    moe = [i for i in range(spec.num_layers) if spec.moe_layers[i]]
    for k, i in enumerate(moe):
        rows = torch.zeros(spec.num_experts, layout.nbytes, dtype=torch.uint8)   # zero padding: files reproducible
        pack_layer_experts(reader, spec, i, layout, rows)
        _save({"experts": rows}, out / expert_file(k))
        files[expert_file(k)] = file_sha256(out / expert_file(k))
        if progress:
            progress(k + 1, len(moe), f"layer {i}")
    copied = _copy_side_files(src, out)
    manifest = {"format_version": FORMAT_VERSION, "weights": opts.weights, "group_size": opts.group_size,
                "resident_weights": opts.resident, "num_moe_layers": len(moe), "num_experts": spec.num_experts,
                "per_layer_precision": [opts.weights if m else "dense-" + opts.resident for m in spec.moe_layers],
                "expert_nbytes": layout.nbytes, "layout": layout_doc(layout), **expert_doc(layout),
                "source_experts": spec.expert_storage, "quantisation": _quantisation(opts.weights, spec.expert_storage),
                "source": {"path": str(src), "fingerprint_sha256": source_fingerprint(src, reader)},
                "files": files, "copied": copied}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


_QUANTISATION = {"int4": "asymmetric round-to-nearest, per output row and group along K",
                 "fp8": "e4m3, one float32 scale per output row",
                 "mxfp4": "e2m1 round-to-nearest, one power-of-two (e8m0) scale per 32 values along K",
                 "bf16": "none"}


def _quantisation(weights: str, source_experts: str) -> str:
    """How the experts were made, for a reader of the manifest."""
    if source_experts == "fp8":
        return _QUANTISATION[weights] + ", of the source's fp8 values times their block scales"
    if source_experts != "mxfp4":
        return _QUANTISATION[weights]
    if weights == "mxfp4":
        return "as shipped: the source's MXFP4 bytes unchanged (gate and up rows de-interleaved)"
    if weights == "bf16":
        return "none: the source's dequantised MXFP4 values (exact in bf16)"
    return _QUANTISATION[weights] + ", of the source's dequantised MXFP4 values"


def _copy_side_files(src: Path, out: Path) -> list[str]:
    """Copy config, tokenizer and other small files of the source; returns their names."""
    reserved = {MANIFEST, RECORD, PARTIAL_MARKER, STAGING, INDEX}
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.suffix not in WEIGHT_SUFFIXES and f.name not in reserved:
            try:
                with open(f, "rb"):
                    pass
            except OSError as e:     # the source's file, not the destination: a fix for the source
                why = "permission denied" if isinstance(e, PermissionError) else (e.strerror or str(e))
                raise ModelLoadError(f"{f} cannot be read ({why}); check its permissions (you need read access to "
                                     "every file of the source folder), or move it out of the folder") from None
            shutil.copy2(f, out / f.name)
            os.chmod(out / f.name, stat.S_IMODE(f.stat().st_mode) & ~umask())   # as cp does: the umask applies
            copied.append(f.name)
    return copied

