"""How a run is shown: a progress line while it runs, a short table after, and a JSON file on request.

The JSON file never replaces a file that exists, unless its name ends in ``!`` (the ``!`` is dropped).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from engine.bench.metrics import RequestRecord
from engine.bench.result import BenchRun
from engine.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
REDRAW_S = 0.1               # the progress line is redrawn at most this often


class ProgressLine:
    """``requests done/total, tokens, tok/s, seconds`` on one line of stderr, redrawn in place; nothing
    when stderr is not a terminal."""

    def __init__(self, label: str, requests: int, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty()
        self.label, self.total = label, requests
        self.finished = self.tokens_seen = 0
        self.start = time.perf_counter()
        self._drawn_at = 0.0

    def tokens(self, n: int) -> None:
        self.tokens_seen += n
        self._draw(False)

    def done(self, record: RequestRecord) -> None:
        self.finished += 1
        self._draw(True)

    def _draw(self, force: bool) -> None:
        now = time.perf_counter()
        if not self.on or (not force and now - self._drawn_at < REDRAW_S):
            return
        self._drawn_at, secs = now, now - self.start
        width = 24
        fill = width * self.finished // max(self.total, 1)
        rate = self.tokens_seen / secs if secs > 0 else 0.0
        self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.finished}/{self.total} requests, "
                          f"{self.tokens_seen} tokens, {rate:.1f} tok/s, {secs:.1f} s ")
        self.stream.flush()

    def clear(self) -> None:
        if self.on:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def table(run: BenchRun) -> list[str]:
    """The run as a few aligned lines."""
    s = run.summary
    where = run.target + (f" ({run.device})" if run.device else "")
    lines = [f"bench      {run.workload.name}: {run.workload.summary()}",
             f"target     {where}, model {run.model}",
             f"requests           {s.requests} ({s.failed} failed)",
             f"tokens in / out    {s.prompt_tokens} / {s.output_tokens}",
             f"wall time          {s.wall_s:.2f} s",
             f"output tok/s       {s.output_tok_s:.1f} aggregate, {_f(s.stream_tok_s)} per stream",
             f"TTFT ms            mean {_f(s.ttft_mean_ms)}, p50 {_f(s.ttft_p50_ms)}, p99 {_f(s.ttft_p99_ms)}",
             f"inter-token ms     p50 {_f(s.itl_p50_ms, '.2f')}, p99 {_f(s.itl_p99_ms, '.2f')}"]
    e = run.engine
    if e is None:
        return lines
    hits = f"{100 * e.expert_hit_rate:.1f}% of {e.expert_lookups} lookups" if e.expert_lookups \
        else "100% (every expert resident)"
    lines += [f"step ms            p50 {_f(e.step_p50_ms, '.2f')}, p99 {_f(e.step_p99_ms, '.2f')} ({e.steps} steps)",
              f"expert hit rate    {hits}",
              f"bus                {e.bus_gb_s:.2f} GB/s, {e.bus_bytes_per_token / 1e6:.2f} MB per output token"]
    if e.hbm_limit_gb_s is None:
        lines.append(f"roofline           none: {e.roofline_note}")
    else:
        bus = f"bus {_f(None if e.bus_fraction is None else 100 * e.bus_fraction)}% of {_f(e.bus_limit_gb_s)} GB/s"
        lines.append(f"roofline           HBM {_f(None if e.hbm_fraction is None else 100 * e.hbm_fraction)}% "
                     f"({e.hbm_bytes_per_token / 1e9:.2f} GB per token at {e.hbm_limit_gb_s:.0f} GB/s), {bus}")
    return lines


def environment(device: str | None) -> dict:
    """Commit, machine and versions a result was measured with."""
    versions = {"python": platform.python_version()}
    for dist in ("torch", "triton", "strata", "httpx"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"commit": _commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "gpu": _gpu_name(device), "cpu": platform.processor() or platform.machine(), "versions": versions}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _gpu_name(device: str | None) -> str | None:
    """The GPU an in-process run used (None on the CPU); for a server run, this machine's first GPU."""
    if device is not None:
        if not device.startswith("cuda"):
            return None
        import torch
        return torch.cuda.get_device_name(torch.device(device))
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception:                   # no NVML, no driver, no GPU: nothing to name
        return None
    return name.decode() if isinstance(name, bytes) else name


def payload(run: BenchRun, config: dict) -> dict:
    """Everything a result file holds: config, environment, workload, results and every request."""
    results = dataclasses.asdict(run.summary)
    if run.engine is not None:
        results["engine"] = dataclasses.asdict(run.engine)
    return {"benchmark": "strata bench", "target": run.target, "model": run.model, "device": run.device,
            "config": config, "engine_config": run.engine_config, "environment": environment(run.device),
            "workload": run.workload.describe(), "results": results, "requests": [_request(r) for r in run.records]}


def _request(r: RequestRecord) -> dict:
    ttft = r.ttft_s
    return {"index": r.index, "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "ttft_ms": None if ttft is None else ttft * 1e3, "stream_tok_s": r.stream_tok_s(),
            "finish_reason": r.finish_reason, "error": r.error}


def json_target(name: str) -> tuple[Path, bool]:
    """(path, may replace) of ``--json NAME``; a name ending in ``!`` may replace what is there."""
    return (Path(name[:-1]), True) if name.endswith("!") else (Path(name), False)


def check_json_target(name: str) -> Path:
    """Refuse, before a run, a ``--json`` path that exists (without ``!``) or whose folder does not."""
    path, replace = json_target(name)
    if path.is_dir():
        raise ConfigError(f"--json {path} is a folder; give a file name, e.g. {path / 'bench.json'}")
    if path.exists() and not replace:
        raise ConfigError(f"--json {path} exists and is kept; give another name, or {path}! to replace it")
    if not path.parent.is_dir():
        raise ConfigError(f"--json {path}: the folder {path.parent} does not exist; create it or give another path")
    return path


def write_json(name: str, data: dict) -> tuple[Path, str | None]:
    """Write ``data`` to ``--json NAME``; returns (the path written, a note when it is not NAME): a file
    that appeared at NAME during the run is kept and the results go beside it."""
    path, replace = json_target(name)
    text = json.dumps(data, indent=2, default=str) + "\n"
    if replace:
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path, None
    for n in range(1, 1000):
        target = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            with open(target, "x") as f:
                f.write(text)
        except FileExistsError:
            continue
        note = None if n == 1 else f"{path} appeared during the run and is kept; the results are in {target}"
        return target, note
    raise ConfigError(f"--json {path}: every name beside it is taken; give another name")
