"""Lazy safetensors reading: one file or shards with ``model.safetensors.index.json``, via mmap."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import ModelLoadError


class TensorSource:
    """Anything that yields named tensors: a checkpoint on disk or a model built in memory."""

    def names(self) -> set[str]: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def get(self, name: str) -> torch.Tensor: ...


class SafetensorsReader(TensorSource):
    """Opens every shard once (mmap); tensors are read only when asked for."""

    def __init__(self, model_dir: str | Path, files: list[Path] | None = None) -> None:
        self.dir = Path(model_dir)
        self._file_of: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        for f in files or self._shard_files():
            handle = self._open(f)
            self._handles[f] = handle
            for name in handle.keys():
                self._file_of[name] = f

    def _shard_files(self) -> list[Path]:
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ModelLoadError(f"{index} is not a valid safetensors index ({e}); restore it from the checkpoint")
            files = sorted({self.dir / v for v in weight_map.values()})
            for f in files:
                if not f.is_file():
                    raise ModelLoadError(f"shard {f.name} listed in {index.name} is missing from {self.dir}; "
                                         "download the complete checkpoint")
            return files
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"no *.safetensors weights in {self.dir}; Strata reads safetensors checkpoints "
                                 "(convert .bin weights with transformers' save_pretrained)")
        return files

    @staticmethod
    def _open(f: Path):
        try:
            # safe_open checks that the header's tensors exactly cover the file: truncation fails here.
            return safe_open(str(f), framework="pt")
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            raise ModelLoadError(f"{f} is not a readable safetensors file ({str(e).splitlines()[0]}); "
                                 "the download is probably truncated — fetch the file again")

    def names(self) -> set[str]:
        return set(self._file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        f = self._file_of[name]
        try:
            return self._handles[f].get_tensor(name)
        except Exception as e:
            raise ModelLoadError(f"{f}: tensor '{name}' cannot be read ({str(e).splitlines()[0]}); the file is "
                                 "probably truncated — fetch it again")

    def file_of(self, name: str) -> Path:
        return self._file_of[name]


class AliasedSource(TensorSource):
    """A source whose tensors are renamed: each (alias, canonical) substring pair maps a name."""

    def __init__(self, source: TensorSource, aliases: tuple[tuple[str, str], ...]) -> None:
        self.source = source
        self.dir = getattr(source, "dir", None)
        self._orig: dict[str, str] = {}
        for name in source.names():
            canon = name
            for alias, canonical in aliases:
                canon = canon.replace(alias, canonical)
            self._orig[canon] = name

    def names(self) -> set[str]:
        return set(self._orig)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(self._orig[name])

    def get(self, name: str) -> torch.Tensor:
        return self.source.get(self._orig[name])


def with_aliases(source: TensorSource, aliases: tuple[tuple[str, str], ...]) -> TensorSource:
    """``source`` itself when no name needs mapping, else an AliasedSource."""
    if not aliases or not any(a in n for n in source.names() for a, _ in aliases):
        return source
    return AliasedSource(source, aliases)
