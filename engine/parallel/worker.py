"""What the process of a pipeline stage past the first runs (started by engine/parallel/pipeline.py).

It loads its stage, then serves its pipe: a step's batch description (build the batch on its own
device, receive the activations from the stage before, run its layers, send them on), live options,
stats requests, and close. It ignores Ctrl-C (the engine's process shuts the stages down) and ends
itself when that process is gone, whether its pipe closes or its parent changes.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from engine.errors import StrataError


def _watch_parent(parent: int) -> None:
    """End this process when the engine's process is gone (no orphan survives a killed engine)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.2)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _load(config, path: str, plan, rank: int, ctrl):
    from engine.checkpoint.converted import ConvertedSource, is_converted
    from engine.checkpoint.reader import SafetensorsReader
    from engine.checkpoint.spec import read_spec
    from engine.loading import LoadedModel
    from engine.parallel.stages import StageContext, StageSource, stage_spec

    def agree(blocks: int) -> int:
        t = torch.tensor([blocks], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ctrl)
        return int(t.item())

    folder = Path(path)
    spec = read_spec(folder)
    # a converted folder's checksums were checked by the first stage before this process started
    source = ConvertedSource(folder, verify=False) if is_converted(folder) else SafetensorsReader(folder)
    stage = plan.stages[rank]
    return LoadedModel(config, stage_spec(spec, stage), StageSource(source, stage), None, folder, (),
                       stage=StageContext(spec, plan, rank, agree))


def _stats(m, rank: int):
    from engine.stats import memory_of
    from engine.telemetry import StageStats
    m.experts.settle()
    s = m.stage.stage
    return StageStats(rank, str(m.device), s.start, s.end, m.experts.stats(), memory_of(m), m.experts.host_syncs)


def _serve(m, conn, rank: int, world: int) -> None:
    from engine.live import apply_to_stage
    from engine.errors import ReconfigureError
    D, dtype, device = m.spec.hidden, m.dtype, m.device
    windowed = bool(m.cache.window_blocks)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return                                    # the engine's process is gone
        kind = msg[0]
        if kind == "step":                            # one micro-batch of a step, in the order they come
            _, parts, tag = msg
            batch = parts.build(m.cache.block_size, device, windowed)
            act = torch.empty(2, parts.num_tokens, D, dtype=dtype, device=device)      # [2, T, D]
            dist.recv(act, src=rank - 1, tag=tag)
            x, out = m.model.layers(act[0], act[1], batch, m.cache)
            dist.send(torch.stack([x, out]).contiguous(), dst=(rank + 1) % world, tag=tag)
        elif kind == "reconfigure":
            try:
                conn.send(("reconfigured", None, apply_to_stage(m, msg[1], msg[2])))
            except ReconfigureError as e:
                conn.send(("reconfigured", str(e), {}))
        elif kind == "stats":
            conn.send(("stats", _stats(m, rank)))
        elif kind == "close":
            return


def main(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    m = None
    code = 0
    try:
        start = conn.recv()
        rank, world, init, backend = start["rank"], start["world"], start["init"], start["backend"]
        config, path, plan = start["config"], start["path"], start["plan"]
        _watch_parent(start["parent"])
        conn.send(("hello",))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=600))
        ctrl = dist.new_group(backend="gloo") if backend != "gloo" else None
        m = _load(config, path, plan, rank, ctrl)
        conn.send(("loaded",))
        _serve(m, conn, rank, world)
    except BaseException as e:        # reported to the engine's process, which stops the pipeline
        code = 1
        kind = type(e).__name__ if isinstance(e, StrataError) else "PipelineError"
        text = str(e) if isinstance(e, StrataError) else f"{type(e).__name__}: {e}"
        if isinstance(e, torch.OutOfMemoryError):
            kind, text = "PipelineError", f"the GPU ran out of memory ({e})".split("\n")[0]
        try:
            conn.send(("error", kind, text))
        except (BrokenPipeError, ConnectionError, EOFError, OSError):
            pass
    finally:
        if m is not None:
            try:
                m.close()
            except Exception:
                pass
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    os._exit(code)


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection
    main(Connection(int(sys.argv[1])))
