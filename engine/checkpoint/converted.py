"""Strata's converted model format: routed experts pre-quantised and laid out expert-contiguous.

A converted folder holds the source's ``config.json`` and tokenizer files, plus

* ``strata.json`` — the manifest: format version, expert format, group size, per-layer precision,
  expert count, the byte layout of one expert (with its biases, if any, and the activation that combines
  gate and up: ``expert_bias``, ``expert_act``), the source's hash, a SHA-256 of every file written and
  the names of the files copied from the source;
* ``resident.safetensors`` — every non-routed tensor under its Hugging Face name;
* ``experts-LLLL.safetensors`` — one tensor ``experts`` ``uint8 [E, nbytes]`` per MoE layer: row ``e``
  is expert ``e``'s byte range (see :mod:`kernels.expert_layout`), so the host store reads each
  expert as one contiguous copy;
* ``strata-verified.json`` — written at the first load: which files were found to match their hashes
  (see :mod:`engine.checkpoint.integrity`).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from engine.checkpoint.integrity import ChecksumReport, Mismatch, Progress, file_sha256, verify_checksums
from engine.checkpoint.reader import SafetensorsReader, TensorSource, cannot_read, folder_denied
from engine.config import DEFAULT_GROUP_SIZE
from engine.errors import ModelLoadError
from kernels.expert_layout import ACTIVATIONS, EXPERT_FORMATS, ExpertAct, ExpertLayout
from kernels.qlinear import QuantWeight

MANIFEST = "strata.json"
FORMAT_VERSION = 1
RESIDENT_FILE = "resident.safetensors"
FP8_SCALE = ".fp8_row_scale"   # suffix of the per-row scale of a resident matrix stored in fp8
INT8_SCALE = ".int8_row_scale"  # ... stored in int8
ROW_SCALES = {"fp8": FP8_SCALE, "int8": INT8_SCALE}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ROOT = Path(__file__).resolve().parents[2]      # the folder that holds engine/, strata/ and main.py


def convert_command(argv0: str | None = None) -> str:
    """``convert`` as the user runs it, for advice to convert again: the way this process was started (the
    installed ``strata``, ``python -m strata``, ``python -m engine``, or ``python main.py`` with the path as it
    was given, so that it works from where the user is), else the installed ``strata`` (a program that calls
    the engine from Python). ``argv0``: the program as started, ``sys.argv[0]`` when None. The interpreter is
    named ``python`` where that is the one running (an activated environment), else by its path: a bare
    ``python`` would be another one, without torch; so is ``strata`` where it is not on the PATH."""
    given = sys.argv[0] if argv0 is None else argv0
    ran = Path(given)
    if ran.name == "__main__.py" and ran.parent.name in ("strata", "engine") and _ours(ran.parent.parent):
        return f"{python_command()} -m {ran.parent.name} convert"
    if ran.name == "main.py" and _ours(ran.parent):
        return f"{python_command()} {shlex.quote(given)} convert"
    if shutil.which("strata") is None:
        beside = Path(sys.executable).parent / "strata"
        return f"{shlex.quote(str(beside))} convert" if beside.is_file() else f"{python_command()} -m strata convert"
    return "strata convert"


def python_command() -> str:
    """``python`` where the PATH finds the interpreter running now, else that interpreter's path."""
    found = shutil.which("python")
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return "python"
    return shlex.quote(sys.executable)


def _ours(folder: Path) -> bool:
    try:
        return folder.resolve() == _ROOT
    except (OSError, RuntimeError):
        return False


def _into_new_folder(doc: object = None) -> str:
    """The fix for a folder whose manifest cannot be read or checked: convert writes a new folder (``--force``
    replaces only a folder whose manifest says what convert wrote there, so it refuses this one)."""
    src = manifest_source(doc) if isinstance(doc, dict) else ""
    return (f"convert the source model again into a new folder: {convert_command()} "
            f"{shlex.quote(src) if src else 'SRC'} NEW_FOLDER")


def _again(folder: Path, doc: dict) -> str:
    """The fix for a manifest that reads but holds a wrong field: convert again over it (``--force`` accepts it)."""
    src = manifest_source(doc)
    weights = f" --weights {doc['weights']}" if doc.get("weights") in EXPERT_FORMATS else ""
    return (f"convert again: {convert_command()} {shlex.quote(src) if src else 'SRC'} {shlex.quote(str(folder))}"
            f"{weights} --force")


def expert_file(moe_index: int) -> str:
    return f"experts-{moe_index:04d}.safetensors"


def layout_doc(layout: ExpertLayout) -> list[dict]:
    return [{"name": s.name, "dtype": str(s.dtype).replace("torch.", ""), "shape": list(s.shape), "offset": s.offset}
            for s in layout.tensors]


def expert_doc(layout: ExpertLayout) -> dict:
    """The manifest fields saying whether experts carry biases and how gate and up combine."""
    act = layout.act
    return {"expert_bias": layout.bias, "expert_act": {"kind": act.kind, "alpha": act.alpha, "limit": act.limit}}


def _act(doc: dict, f: Path, fix: str) -> ExpertAct:
    """``expert_act`` of a manifest (one written before experts had other activations: silu)."""
    v = doc.get("expert_act", {"kind": "silu"})
    default = ExpertAct()
    ok = isinstance(v, dict) and v.get("kind") in ACTIVATIONS and all(
        isinstance(v.get(k, 0.0), (int, float)) and not isinstance(v.get(k), bool) for k in ("alpha", "limit"))
    if not ok:
        raise ModelLoadError(f"{f}: field 'expert_act' is {v!r}, expected {{\"kind\": one of {', '.join(ACTIVATIONS)}, "
                             f"\"alpha\": a number, \"limit\": a number}}; {fix}")
    return ExpertAct(v["kind"], float(v.get("alpha", default.alpha)), float(v.get("limit", default.limit)))


def read_manifest(folder: Path) -> dict:
    """The parsed ``strata.json`` of ``folder`` with a checked ``files`` table (any format version)."""
    f = folder / MANIFEST
    try:
        raw = f.read_bytes()
    except OSError as e:
        raise cannot_read(f, e, "check the disk it is on, or " + _into_new_folder()) from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{f} is not valid JSON ({e}); {_into_new_folder()}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("format_version"), int):
        raise ModelLoadError(f"{f} is not a Strata manifest (no integer 'format_version'); {_into_new_folder(doc)}")
    files = doc.get("files")
    if not isinstance(files, dict) or not files:
        raise ModelLoadError(f"{f}: 'files' must map each written file to its SHA-256; {_into_new_folder(doc)}")
    for name, digest in files.items():
        if not _plain_name(name) or not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ModelLoadError(f"{f}: the entry {name!r}: {digest!r} of 'files' is not a file name inside the folder "
                                 f"with a SHA-256; {_into_new_folder(doc)}")
    copied = doc.get("copied", [])
    if not isinstance(copied, list) or not all(_plain_name(n) for n in copied):
        raise ModelLoadError(f"{f}: 'copied' must list file names inside the folder; {_into_new_folder(doc)}")
    return doc


def manifest_source(doc: dict) -> str:
    """The folder a manifest says it was converted from, or '' when it does not say."""
    src = doc.get("source")
    return src["path"] if isinstance(src, dict) and isinstance(src.get("path"), str) else ""


def _plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _field(doc: dict, key: str, kind: type, f: Path, fix: str):
    v = doc.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) or (kind is int and v < 0):
        expected = "a whole number of 0 or more" if kind is int else f"a {kind.__name__}"
        raise ModelLoadError(f"{f}: field '{key}' is {v!r}, expected {expected}; {fix}")
    return v


@dataclass(frozen=True)
class Manifest:
    weights: str
    group_size: int
    num_moe_layers: int
    num_experts: int
    expert_nbytes: int
    layout: list
    files: dict
    source: str = ""       # the folder it was converted from, for the advice to convert again
    resident: str = "bf16"  # storage of the resident weights
    bias: bool = False      # experts carry w13_bias / w2_bias
    act: ExpertAct = ExpertAct()

    @staticmethod
    def read(folder: Path) -> "Manifest":
        f = folder / MANIFEST
        doc = read_manifest(folder)
        fix = _again(folder, doc)
        if doc["format_version"] != FORMAT_VERSION:
            raise ModelLoadError(f"{f} has format version {doc['format_version']!r} but this Strata reads "
                                 f"version {FORMAT_VERSION}; {fix}")
        if doc.get("weights") not in EXPERT_FORMATS:
            raise ModelLoadError(f"{f}: field 'weights' is {doc.get('weights')!r}, expected one of "
                                 f"{', '.join(EXPERT_FORMATS)}; {fix}")
        bias = doc.get("expert_bias", False)
        if not isinstance(bias, bool):
            raise ModelLoadError(f"{f}: field 'expert_bias' is {bias!r}, expected true or false; {fix}")
        return Manifest(_field(doc, "weights", str, f, fix), _field(doc, "group_size", int, f, fix),
                        _field(doc, "num_moe_layers", int, f, fix), _field(doc, "num_experts", int, f, fix),
                        _field(doc, "expert_nbytes", int, f, fix), _field(doc, "layout", list, f, fix), doc["files"],
                        manifest_source(doc), str(doc.get("resident_weights", "bf16")), bias, _act(doc, f, fix))

    def check_layout(self, layout: ExpertLayout, folder: Path) -> None:
        """The experts were written for ``layout`` (bytes, biases and activation), which config.json implies."""
        if layout.nbytes != self.expert_nbytes or layout_doc(layout) != self.layout or layout.bias != self.bias:
            raise ModelLoadError(f"{folder / MANIFEST}: the expert byte layout differs from what this Strata expects "
                                 f"for its config; convert again: {self.reconvert(folder)}")
        if layout.act != self.act:
            a, b = self.act, layout.act
            raise ModelLoadError(f"{folder / MANIFEST}: the experts were converted for the activation {a.kind} (alpha "
                                 f"{a.alpha:g}, limit {a.limit:g}) but config.json implies {b.kind} (alpha {b.alpha:g}, "
                                 f"limit {b.limit:g}); restore config.json or convert again: {self.reconvert(folder)}")

    def reconvert(self, folder: Path) -> str:
        """The command that writes ``folder`` again, as it was written."""
        src = shlex.quote(self.source) if self.source else "SRC"
        extra = f" --group-size {self.group_size}" if self.weights == "int4" and self.group_size != DEFAULT_GROUP_SIZE else ""
        extra += f" --resident-weights {self.resident}" if self.resident != "bf16" else ""
        return f"{convert_command()} {src} {shlex.quote(str(folder))} --weights {self.weights}{extra} --force"


def is_converted(folder: Path) -> bool:
    """``folder`` holds a manifest (a converted model); one line, not an answer, where a permission stops the look."""
    try:
        return stat.S_ISREG(os.stat(folder / MANIFEST).st_mode)
    except PermissionError:
        raise folder_denied(folder) from None
    except OSError:
        return False


class ConvertedSource(TensorSource):
    """Resident tensors by name, plus whole layers of packed experts.

    Opening one checks every file against the manifest's SHA-256 first (see ``integrity``); ``verify``
    hashes them all even when an earlier load found them good.
    """

    def __init__(self, folder: Path, verify: bool = False, progress: Progress | None = None) -> None:
        self.dir = folder
        self.manifest = Manifest.read(folder)
        self.checksums = self._verify(verify, progress)
        self._resident = SafetensorsReader(folder, [folder / RESIDENT_FILE])
        names = self._resident.names()
        # matrix name -> the 8-bit format it is stored in (its row scale beside it)
        self._quant = {n[: -len(suffix)]: fmt for fmt, suffix in ROW_SCALES.items() for n in names
                       if n.endswith(suffix)}
        self._names = names - {n + ROW_SCALES[fmt] for n, fmt in self._quant.items()}

    def _verify(self, force: bool, progress: Progress | None) -> ChecksumReport:
        m, folder = self.manifest, self.dir
        needed = [RESIDENT_FILE] + [expert_file(k) for k in range(m.num_moe_layers)]
        unlisted = [n for n in needed if n not in m.files]
        if unlisted:
            raise ModelLoadError(f"{folder / MANIFEST} lists no SHA-256 for {unlisted[0]}, so it cannot be checked; "
                                 f"convert again: {m.reconvert(folder)}")
        report = verify_checksums(folder, m.files, force, progress)
        if report.bad:
            raise ModelLoadError(_bad_files(folder, report.bad, m.reconvert(folder)))
        return report

    def names(self) -> set[str]:
        return set(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._resident.shape(name)

    def dtype(self, name: str) -> str:
        return "float32" if name in self._quant else self._resident.dtype(name)

    def get(self, name: str) -> torch.Tensor:
        t = self._resident.get(name)
        fmt = self._quant.get(name)
        if fmt is not None:     # an 8-bit matrix asked for widened (a load that keeps resident weights in the dtype)
            t = t.to(torch.float32) * self._resident.get(name + ROW_SCALES[fmt])[:, None]
        return t

    def stored_quant(self, name: str, fmt: str) -> QuantWeight | None:
        if self._quant.get(name) != fmt:
            return None
        return QuantWeight(self._resident.get(name), self._resident.get(name + ROW_SCALES[fmt]).float(), fmt)

    def file_of(self, name: str) -> Path:
        return self._resident.file_of(name)

    def read_experts(self, moe_index: int, out: torch.Tensor) -> None:
        """Copy MoE layer ``moe_index``'s packed experts into ``out`` ``uint8 [E, nbytes]``."""
        f = self.dir / expert_file(moe_index)
        if f.name not in self.manifest.files:      # every listed file was found good when the folder was opened
            raise ModelLoadError(f"{f} is not part of this conversion: {MANIFEST} lists {self.manifest.num_moe_layers} "
                                 f"MoE layers but config.json has more; convert again: {self.manifest.reconvert(self.dir)}")
        reader = SafetensorsReader(self.dir, [f])
        if "experts" not in reader.names():
            raise ModelLoadError(f"{f} holds no tensor 'experts'; convert again: {self.manifest.reconvert(self.dir)}")
        shape, dtype = tuple(reader.shape("experts")), reader.dtype("experts")
        if shape != tuple(out.shape) or dtype != "uint8":
            raise ModelLoadError(f"{f}: packed experts are {dtype} {list(shape)}, expected uint8 {list(out.shape)}; "
                                 f"convert again: {self.manifest.reconvert(self.dir)}")
        out.copy_(reader.get("experts"))


def _bad_files(folder: Path, bad: tuple[Mismatch, ...], reconvert: str) -> str:
    """One line on the first file that failed its check: the cause, and the fix for that cause (a file this user
    may not read is fixed by its permissions, not by converting again)."""
    first = bad[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    path = folder / first.name
    if first.reason == "denied":
        return f"{path} cannot be read (permission denied){more}; check its permissions: you need read access to it"
    if first.reason == "unreadable":
        return (f"{path} cannot be read ({first.error}){more}; check the disk it is on, then restore the folder from "
                f"a copy or convert again: {reconvert}")
    what = ("is missing; the converted folder is incomplete" if first.reason == "missing" else
            f"does not match its SHA-256 in {MANIFEST}: the file was changed or damaged on disk")
    return f"{path} {what}{more}; restore the folder from a copy or convert again: {reconvert}"


def verify_files(folder: Path, files: dict) -> None:
    """Every file of ``files`` exists in ``folder`` with its SHA-256 (read back after writing, nothing remembered)."""
    for name, digest in files.items():
        f = folder / name
        if not f.is_file() or file_sha256(f) != digest:
            raise ModelLoadError(f"{f} does not match the hash just recorded for it; the write was incomplete or the "
                                 "disk is failing — check the disk and convert again")
