"""Strata's converted model format: routed experts pre-quantised and laid out expert-contiguous.

A converted folder holds the source's ``config.json`` and tokenizer files, plus

* ``strata.json`` — the manifest: format version, expert format, group size, per-layer precision,
  expert count, the byte layout of one expert, the source's hash, and a SHA-256 of every file written;
* ``resident.safetensors`` — every non-routed tensor under its Hugging Face name;
* ``experts-LLLL.safetensors`` — one tensor ``experts`` ``uint8 [E, nbytes]`` per MoE layer: row ``e``
  is expert ``e``'s byte range (see :mod:`engine.experts.layout`), so the host store reads each
  expert as one contiguous copy.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from engine.checkpoint.reader import SafetensorsReader, TensorSource
from engine.errors import ModelLoadError
from engine.experts.layout import ExpertLayout

MANIFEST = "strata.json"
FORMAT_VERSION = 1
RESIDENT_FILE = "resident.safetensors"
FP8_SCALE = ".fp8_row_scale"   # suffix of the per-row scale of a resident matrix stored in fp8


def expert_file(moe_index: int) -> str:
    return f"experts-{moe_index:04d}.safetensors"


def file_sha256(path: Path, chunk: int = 16 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def layout_doc(layout: ExpertLayout) -> list[dict]:
    return [{"name": s.name, "dtype": str(s.dtype).replace("torch.", ""), "shape": list(s.shape), "offset": s.offset}
            for s in layout.tensors]


@dataclass(frozen=True)
class Manifest:
    weights: str
    group_size: int
    num_moe_layers: int
    num_experts: int
    expert_nbytes: int
    layout: list
    files: dict

    @staticmethod
    def read(folder: Path) -> "Manifest":
        f = folder / MANIFEST
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"{f} cannot be read ({e}); convert the model again with main.py convert")
        if doc.get("format_version") != FORMAT_VERSION:
            raise ModelLoadError(f"{f} has format version {doc.get('format_version')!r} but this Strata reads "
                                 f"version {FORMAT_VERSION}; convert the model again with this version")
        return Manifest(doc["weights"], int(doc["group_size"]), int(doc["num_moe_layers"]), int(doc["num_experts"]),
                        int(doc["expert_nbytes"]), doc["layout"], doc.get("files", {}))

    def check_layout(self, layout: ExpertLayout, folder: Path) -> None:
        if layout.nbytes != self.expert_nbytes or layout_doc(layout) != self.layout:
            raise ModelLoadError(f"{folder / MANIFEST}: the expert byte layout differs from what this Strata expects "
                                 "for its config; convert the model again with main.py convert")


def is_converted(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


class ConvertedSource(TensorSource):
    """Resident tensors by name, plus whole layers of packed experts."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.manifest = Manifest.read(folder)
        f = folder / RESIDENT_FILE
        if not f.is_file():
            raise ModelLoadError(f"{f} is missing; the converted folder is incomplete — convert the model again")
        self._resident = SafetensorsReader(folder, [f])
        names = self._resident.names()
        self._fp8 = {n[: -len(FP8_SCALE)] for n in names if n.endswith(FP8_SCALE)}
        self._names = names - {n + FP8_SCALE for n in self._fp8}

    def names(self) -> set[str]:
        return set(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._resident.shape(name)

    def get(self, name: str) -> torch.Tensor:
        t = self._resident.get(name)
        if name in self._fp8:   # fp8 storage of a resident matrix: widened at load, saves disk not VRAM
            t = t.to(torch.float32) * self._resident.get(name + FP8_SCALE)[:, None]
        return t

    def file_of(self, name: str) -> Path:
        return self._resident.file_of(name)

    def read_experts(self, moe_index: int, out: torch.Tensor) -> None:
        """Copy MoE layer ``moe_index``'s packed experts into ``out`` ``uint8 [E, nbytes]``."""
        f = self.dir / expert_file(moe_index)
        if not f.is_file():
            raise ModelLoadError(f"{f} is missing; the converted folder is incomplete — convert the model again")
        t = SafetensorsReader(self.dir, [f]).get("experts")
        if tuple(t.shape) != tuple(out.shape) or t.dtype != torch.uint8:
            raise ModelLoadError(f"{f}: packed experts have shape {list(t.shape)}, expected {list(out.shape)}; "
                                 "convert the model again")
        out.copy_(t)


def verify_files(folder: Path, files: dict) -> None:
    """Every file the manifest lists exists with its recorded SHA-256."""
    for name, digest in files.items():
        f = folder / name
        if not f.is_file() or file_sha256(f) != digest:
            raise ModelLoadError(f"{f} does not match the hash in {MANIFEST}; the write was incomplete or the file "
                                 "changed — convert again with --force")

