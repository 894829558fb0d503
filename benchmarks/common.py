"""What every benchmark result file records: commit, machine, versions, config."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def environment() -> dict:
    """Where and with what a result was measured (STRATA_COMMIT names the commit where there is no .git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    env = {"commit": os.environ.get("STRATA_COMMIT") or commit or "unknown", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor() or
           platform.machine(), "threads": torch.get_num_threads()}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        try:
            import triton
            env["triton"] = triton.__version__
        except ImportError:
            pass
    return env


def write_result(path: str | Path, payload: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"environment": environment(), **payload}, indent=2) + "\n")


def h2d_bandwidth_gbs(device: torch.device | str, nbytes: int = 1 << 30, repeats: int = 8) -> float:
    """Host -> ``device`` copy bandwidth in GB/s (1e9): a page-locked ``nbytes`` buffer on CUDA,
    a plain memcpy between two host buffers on the CPU (what the CPU "bus" of an offload run is)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(2):
        dst.copy_(src, non_blocking=cuda)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=cuda)
    sync()
    return nbytes * repeats / (time.perf_counter() - t0) / 1e9


def interval_union(spans) -> float:
    """The length covered by the ``(start, end)`` intervals of ``spans``, overlaps counted once."""
    total, hi = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= hi:
            continue
        total += e - max(s, hi)
        hi = e
    return total
