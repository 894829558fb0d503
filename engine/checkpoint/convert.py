"""``convert``: a Hugging Face MoE checkpoint -> Strata's converted format (see converted.py).

Streams layer by layer (one layer's experts in memory at a time), so a checkpoint larger than RAM
converts. Writes into a temporary folder beside the destination and renames it at the end, after
every file has been re-read and checked against the hash recorded in the manifest.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.checkpoint.converted import (FORMAT_VERSION, FP8_SCALE, MANIFEST, RESIDENT_FILE, expert_file,
                                         file_sha256, layout_doc, verify_files)
from engine.checkpoint.loader import check_complete, pack_layer_experts
from engine.checkpoint.plan import tensor_plan
from engine.checkpoint.reader import SafetensorsReader
from engine.checkpoint.spec import read_spec
from engine.config import GROUP_SIZES
from engine.errors import ConfigError
from engine.experts.layout import ExpertLayout

EXPERT_FORMATS = {"int4": "int4", "fp8": "fp8", "bf16": "bf16"}
RESIDENT_FORMATS = ("bf16", "fp8")
Progress = Callable[[int, int, str], None]


def source_fingerprint(src: Path, reader: SafetensorsReader) -> str:
    """SHA-256 over config.json and every shard's name, size and safetensors header (cheap for huge models)."""
    h = hashlib.sha256((src / "config.json").read_bytes())
    for f in sorted({reader.file_of(n) for n in reader.names()}):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            h.update(f.name.encode() + str(f.stat().st_size).encode() + fh.read(n))
    return h.hexdigest()


def _check_args(src: Path, dst: Path, weights: str, group_size: int, resident: str, force: bool) -> None:
    if weights not in EXPERT_FORMATS:
        raise ConfigError(f"--weights {weights!r} is not a known format; choose int4, fp8 or bf16")
    if resident not in RESIDENT_FORMATS:
        raise ConfigError(f"--resident-weights {resident!r} is not a known format; choose bf16 or fp8")
    if group_size not in GROUP_SIZES:
        raise ConfigError(f"--group-size {group_size} is not supported; choose 32, 64 or 128")
    if dst.resolve() == src.resolve():
        raise ConfigError("the destination is the source folder; choose another destination")
    if dst.exists() and any(dst.iterdir()) and not force:
        raise ConfigError(f"{dst} already exists; pass --force to overwrite it or choose another folder")


def _resident_tensors(reader: SafetensorsReader, spec, resident: str) -> dict[str, torch.Tensor]:
    from engine.quant import quantize_fp8
    out: dict[str, torch.Tensor] = {}
    for t in tensor_plan(spec):
        if t.category == "routed_experts":
            continue
        w = reader.get(t.name)
        if resident == "fp8" and w.dim() == 2 and t.category not in ("embeddings", "router"):
            q, scale = quantize_fp8(w.to(torch.float32))
            out[t.name], out[t.name + FP8_SCALE] = q, scale
        else:
            out[t.name] = w.to(torch.bfloat16).contiguous()
    return out


def convert(src: str | Path, dst: str | Path, weights: str = "int4", group_size: int = 128,
            resident: str = "bf16", force: bool = False, progress: Progress | None = None) -> Path:
    """Convert ``src`` into ``dst``; returns ``dst``. Raises StrataError subclasses on bad input."""
    src, dst = Path(src), Path(dst)
    _check_args(src, dst, weights, group_size, resident, force)
    spec = read_spec(src)
    layout = ExpertLayout.make(EXPERT_FORMATS[weights], spec.hidden, spec.moe_ffn, group_size)
    reader = SafetensorsReader(src)
    check_complete(spec, reader)
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files: dict[str, str] = {}
    save_file(_resident_tensors(reader, spec, resident), tmp / RESIDENT_FILE)
    files[RESIDENT_FILE] = file_sha256(tmp / RESIDENT_FILE)
    moe = [i for i in range(spec.num_layers) if spec.moe_layers[i]]
    for k, i in enumerate(moe):
        rows = torch.empty(spec.num_experts, layout.nbytes, dtype=torch.uint8)
        pack_layer_experts(reader, spec, i, layout, rows)
        save_file({"experts": rows}, tmp / expert_file(k))
        files[expert_file(k)] = file_sha256(tmp / expert_file(k))
        if progress:
            progress(k + 1, len(moe), f"layer {i}")
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy2(f, tmp / f.name)
    manifest = {"format_version": FORMAT_VERSION, "weights": weights, "group_size": group_size,
                "resident_weights": resident, "num_moe_layers": len(moe), "num_experts": spec.num_experts,
                "per_layer_precision": [weights if m else "dense-" + resident for m in spec.moe_layers],
                "expert_nbytes": layout.nbytes, "layout": layout_doc(layout),
                "quantisation": {"int4": "asymmetric round-to-nearest, per output row and group along K",
                                 "fp8": "e4m3, one float32 scale per output row"}.get(weights, "none"),
                "source": {"path": str(src.resolve()), "fingerprint_sha256": source_fingerprint(src, reader)},
                "files": files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    verify_files(tmp, files)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return dst


def bar(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    fill = width * done // max(total, 1)
    sys.stderr.write(f"\rconverting [{'#' * fill}{'.' * (width - fill)}] {done}/{total} {label:<12}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
