"""Lazy safetensors reading: one file or shards with ``model.safetensors.index.json``, via mmap."""
from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from engine.errors import ModelLoadError

if TYPE_CHECKING:
    from kernels.qlinear import QuantWeight

INDEX = "model.safetensors.index.json"
# safetensors header dtypes by the name torch gives the same type (what error messages show)
_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
                "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
                "BOOL": "bool"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the spelling every source reports dtypes in."""
    return str(dtype).removeprefix("torch.")


class TensorSource:
    """Anything that yields named tensors: a checkpoint on disk or a model built in memory."""

    def names(self) -> set[str]: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def get(self, name: str) -> torch.Tensor: ...

    def dtype(self, name: str) -> str:
        """The dtype ``get(name)`` returns, by name ("bfloat16"); sources on disk read it from the header."""
        return dtype_name(self.get(name).dtype)

    def file_of(self, name: str) -> Path | None:
        """The file holding tensor ``name``, or None for a source in memory."""
        return None

    def stored_quant(self, name: str, fmt: str) -> "QuantWeight | None":
        """Matrix ``name`` as stored in 8 bits (``fmt``: fp8 | int8) with its row scales, on the host,
        when the source keeps it so (a converted folder); None: ``get`` is all there is."""
        return None


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
        index = self.dir / INDEX
        if index.is_file():
            files = sorted({shard_path(self.dir, v) for v in read_weight_map(index).values()})
            for f in files:
                if not f.is_file():
                    raise ModelLoadError(f"shard {f.name} listed in {index.name} is missing from {self.dir}; "
                                         "download the complete checkpoint")
            return files
        try:
            names = os.listdir(self.dir)
        except OSError as e:
            raise cannot_list(self.dir, e) from None
        files = sorted(self.dir / n for n in names if n.endswith(".safetensors"))
        if not files:
            raise ModelLoadError(f"no *.safetensors weights in {self.dir}; Strata reads safetensors checkpoints "
                                 "(convert .bin weights with transformers' save_pretrained)")
        return files

    @staticmethod
    def _open(f: Path):
        if f.is_symlink() and not f.exists():
            raise ModelLoadError(f"{f} is a link to {os.readlink(f)}, which does not exist; fetch the checkpoint "
                                 "again (a download cache lost the file the link points to)")
        try:
            # safe_open checks that the header's tensors exactly cover the file: truncation fails here.
            return safe_open(str(f), framework="pt")
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            _check_opens(f)     # its text for a file it may not open names no cause ("No such file")
            raise ModelLoadError(f"{f} is not a readable safetensors file ({str(e).splitlines()[0]}); "
                                 "the download is probably truncated — fetch the file again")

    def names(self) -> set[str]:
        return set(self._file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        raw = self._handles[self._file_of[name]].get_slice(name).get_dtype()
        return _DTYPE_NAMES.get(raw, raw.lower())

    def get(self, name: str) -> torch.Tensor:
        f = self._file_of[name]
        try:
            return self._handles[f].get_tensor(name)
        except Exception as e:
            raise ModelLoadError(f"{f}: tensor '{name}' cannot be read ({str(e).splitlines()[0]}); the file is "
                                 "probably truncated — fetch it again")

    def file_of(self, name: str) -> Path:
        return self._file_of[name]


def _check_opens(f: Path) -> None:
    """Raise the one-line error for a file the OS will not open for reading (its permissions, a failing disk)."""
    try:
        with open(f, "rb"):
            pass
    except OSError as e:
        raise cannot_read(f, e, "fetch the file again") from None


def cannot_read(path: Path, e: OSError, fix: str) -> ModelLoadError:
    """``path`` could not be opened or read: a permission that stops it says to fix the permissions (the file is
    fine), any other cause is named with ``fix``."""
    if isinstance(e, PermissionError):
        return ModelLoadError(f"{path} cannot be read (permission denied); check its permissions: you need read "
                              "access to it")
    return ModelLoadError(f"{path} cannot be read ({e.strerror or e}); {fix}")


def cannot_list(folder: Path, e: OSError) -> ModelLoadError:
    """The model folder can be entered but not listed, so the files in it cannot be found."""
    why = "permission denied" if isinstance(e, PermissionError) else (e.strerror or str(e))
    fix = ("check its permissions: you need read access to it" if isinstance(e, PermissionError) else
           "check the folder and the disk it is on")
    return ModelLoadError(f"the model folder {folder} cannot be listed ({why}), so its weight files cannot be "
                          f"found; {fix}")


def check_folder_readable(folder: Path) -> None:
    """Raise one line when a permission stops this user from reaching ``folder`` or looking inside it; a folder
    that does not exist, or that is not a folder, is left to the caller to report."""
    try:
        os.stat(folder)
    except PermissionError:
        raise ModelLoadError(f"the model folder {folder} cannot be reached (permission denied on a folder above "
                             "it); check the permissions of the folders on its path") from None
    except OSError:
        return
    try:
        os.stat(folder / "config.json")
    except PermissionError:
        raise folder_denied(folder) from None
    except OSError:
        return


def folder_denied(folder: Path) -> ModelLoadError:
    """The model folder cannot be entered (no execute permission, or no read and execute) by this user."""
    return ModelLoadError(f"the model folder {folder} cannot be read (permission denied); check its permissions: you "
                          "need read and execute access to it")


def read_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a safetensors index: tensor name -> shard file name, checked for shape."""
    fix = "restore it from the original checkpoint"
    try:
        text = index.read_bytes()
    except OSError as e:
        raise cannot_read(index, e, fix) from None
    try:
        doc = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{index} is not a valid safetensors index ({e}); {fix}")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        found = "no 'weight_map'" if weight_map is None else f"a 'weight_map' that is a {type(weight_map).__name__}"
        raise ModelLoadError(f"{index} has {found}, expected an object mapping tensor names to shard files; {fix}")
    if not weight_map:
        raise ModelLoadError(f"{index}: 'weight_map' lists no tensors; {fix}")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise ModelLoadError(f"{index}: tensor '{name}' maps to {shard!r}, expected a shard file name; {fix}")
    return weight_map


def shard_path(model_dir: Path, shard: str) -> Path:
    """``model_dir / shard``, refused when the index points outside the model folder.

    The shard file itself may be a symbolic link (the Hugging Face cache stores every file as one),
    but its name may not climb out of the folder, be absolute, or pass through a linked folder that does.
    """
    index = model_dir / INDEX
    parts = PurePosixPath(shard.replace("\\", "/"))
    if parts.is_absolute() or ".." in parts.parts or Path(shard).is_absolute() or Path(shard).drive:
        raise ModelLoadError(f"{index} names shard '{shard}', which is outside the model folder; shards must be "
                             f"files inside {model_dir} — restore the index from the original checkpoint")
    path = model_dir.joinpath(*parts.parts)
    root = model_dir.resolve()
    if path.parent.resolve() != root and root not in path.parent.resolve().parents:
        raise ModelLoadError(f"{index} names shard '{shard}', whose folder links outside the model folder; "
                             f"shards must be files inside {model_dir} — restore the index from the original checkpoint")
    return path


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

    def dtype(self, name: str) -> str:
        return self.source.dtype(self._orig[name])

    def get(self, name: str) -> torch.Tensor:
        return self.source.get(self._orig[name])

    def file_of(self, name: str) -> Path | None:
        return self.source.file_of(self._orig[name])

    def stored_quant(self, name: str, fmt: str) -> "QuantWeight | None":
        return self.source.stored_quant(self._orig[name], fmt)


def with_aliases(source: TensorSource, aliases: tuple[tuple[str, str], ...]) -> TensorSource:
    """``source`` itself when no name needs mapping, else an AliasedSource."""
    if not aliases or not any(a in n for n in source.names() for a, _ in aliases):
        return source
    return AliasedSource(source, aliases)
