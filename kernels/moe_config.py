"""Launch settings of the MoE GEMM kernels, read from JSON in ``kernels/configs/``.

One file per GPU, named after ``torch.cuda.get_device_name`` with non-alphanumerics as ``_``
(``NVIDIA_H200.json``, ``NVIDIA_H100_80GB_HBM3.json``). A card without its own file takes a sibling's
of the same model (the name up to its first word with a digit: an ``NVIDIA H100 PCIe`` reads the
``NVIDIA_H100_80GB_HBM3`` table, an ``NVIDIA H200 NVL`` the ``NVIDIA_H200`` one): the same chip, so the
same kernels win, where ``default.json``'s conservative settings are slower. ``default.json`` is the fallback for other GPUs and missing entries. A file
maps ``format -> token bucket -> setting``; the bucket used is the smallest one at least the batch's
token count (else the largest). A setting::

    {"variant": "decode" | "prefill",
     "up":   {"block_n": 16, "block_k": 256, "num_warps": 4, "num_stages": 3},
     "down": {"block_n": 16, "block_k": 256, "num_warps": 4, "num_stages": 3, "preload": 1},
     "block_m": 16,          # prefill only: rows of the aligned blocks
     "join": true,           # prefill, int4: tiles of joined nibbles (absent: the kernel's default)
     "pdl": true}            # decode, int4: launches overlap (Hopper and later)

``decode`` runs one program per (token, expert) pair and N tile (a GEMV per pair); ``prefill`` aligns
pairs into M-blocks per expert and runs tensor-core tiles. Formats are the expert layout's
(``bf16`` ... ``int4``, ``mxfp4``); ``block_k`` counts elements, rounded up to whole groups where the
format has them (int4 decode: its group size; mxfp4: 32, and at least 32 in prefill tiles).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class TileConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    preload: int = 1      # int4 decode with pdl: K chunks of weights read before waiting for the predecessor


@dataclass(frozen=True)
class MoeLaunchConfig:
    variant: str          # "decode" or "prefill"
    up: TileConfig        # gate+up GEMM (N = F, K = D)
    down: TileConfig      # down GEMM (N = D, K = F)
    block_m: int = 16     # prefill block rows
    pdl: bool = False     # decode (int4): programmatic dependent launch where the GPU has it
    join: bool | None = None   # prefill (int4): tiles of joined nibbles; None: kernels/moe_prefill.py's default


def config_file_name(device_name: str) -> str:
    """``"NVIDIA H200"`` -> ``"NVIDIA_H200.json"``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json"


@lru_cache(maxsize=None)
def _load(name: str) -> dict:
    path = CONFIG_DIR / name
    return json.loads(path.read_text()) if path.is_file() else {}


def _parse(entry: dict) -> MoeLaunchConfig:
    variant = entry.get("variant", "decode")
    if variant not in ("decode", "prefill"):
        raise ValueError(f"MoE launch config variant {variant!r} must be decode or prefill")
    return MoeLaunchConfig(variant, TileConfig(**entry["up"]), TileConfig(**entry["down"]),
                           int(entry.get("block_m", 16)), bool(entry.get("pdl", False)),
                           None if entry.get("join") is None else bool(entry["join"]))


def _pick(table: dict, fmt: str, tokens: int) -> dict | None:
    buckets = table.get(fmt) or table.get("*")
    if not buckets:
        return None
    sizes = sorted(int(b) for b in buckets)
    size = next((b for b in sizes if b >= tokens), sizes[-1])
    return buckets[str(size)]


@lru_cache(maxsize=None)
def table_name(device_name: str) -> str | None:
    """The table file ``device_name`` reads: its own, else a sibling's (the same name up to its first
    word with a digit, the model; the first in name order), else None (``default.json`` only)."""
    own = config_file_name(device_name)
    if (CONFIG_DIR / own).is_file():
        return own
    words = own[:-len(".json")].split("_")
    model = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), None)
    if model is None:
        return None
    prefix = "_".join(words[:model + 1])
    siblings = sorted(p.name for p in CONFIG_DIR.glob("*.json")
                      if p.stem == prefix or p.stem.startswith(prefix + "_"))
    return siblings[0] if siblings else None


def moe_launch_config(device_name: str, fmt: str, tokens: int) -> MoeLaunchConfig:
    """Setting for ``tokens`` tokens of expert format ``fmt`` on ``device_name`` (with fallback)."""
    name = table_name(device_name)
    entry = _pick(_load(name), fmt, tokens) if name else None
    if entry is None:
        entry = _pick(_load("default.json"), fmt, tokens)
    if entry is None:
        raise FileNotFoundError(f"no MoE launch setting for {fmt}; {CONFIG_DIR / 'default.json'} is incomplete")
    return _parse(entry)
