"""The first stage's side of a pipeline: it starts one process per other stage, hands each step's
activations down the stages over torch.distributed, and stops them all when one fails.

Wiring (N stages, rank 0 is the engine's own process):

* control: one ``multiprocessing`` pipe per worker, carrying pickled messages (a step's batch
  description, live options, stats requests, close) and their replies (or a worker's error);
* activations: ``torch.distributed`` point to point, NCCL between GPUs (gloo on the CPU): rank 0
  sends the residual stream and the last block's output ``[2, T, D]`` after its layers to rank 1,
  each rank to the next, and the last back to rank 0, which adds them and runs the LM head;
* agreement at load: every stage's KV cache holds the same number of blocks (the smallest any
  card affords), reduced over a gloo group.

Every wait of rank 0 polls its workers: a worker that reports an error or whose process ended
stops the pipeline with one :class:`PipelineError` (or the worker's own error, at load), and no
process is left behind. Workers watch their parent the same way (engine/parallel/worker.py).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from multiprocessing.connection import Connection
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from engine import errors
from engine.checkpoint.reader import TensorSource
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.errors import ConfigError, PipelineError, ReconfigureError, StrataError
from engine.parallel.plan import PipelinePlan, plan_pipeline
from engine.parallel.stages import StageContext, StageSource, stage_spec
from engine.runner.batch import BatchParts
from engine.telemetry import StageStats
from engine.tokenizer import Tokenizer

_ROOT = Path(__file__).resolve().parents[2]       # the folder holding the engine package
JOIN_TIMEOUT_S = 60.0 * 10          # the longest a collective of the pipeline may wait (a slow load included)
_SPIN = 2000                        # polls without sleeping before a wait starts to sleep between polls


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_name(code: int) -> str:
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def stage_configs(config: EngineConfig, plan: PipelinePlan, device: torch.device) -> list[EngineConfig]:
    """Each stage's own settings: its GPU, its card's budget, its share of an explicit KV size."""
    n = plan.size
    budget = config.gpu_memory_budget
    budgets = list(budget) if isinstance(budget, tuple) else [None if budget is None else budget // n] * n
    layers = sum(s.end - s.start for s in plan.stages)
    out = []
    for s in plan.stages:
        dev = "cpu" if device.type == "cpu" else f"cuda:{s.rank}"
        kv = None if config.kv_cache_size is None else config.kv_cache_size * (s.end - s.start) // layers
        out.append(config.replace(device=dev, gpu_memory_budget=budgets[s.rank], kv_cache_size=kv,
                                  cuda_graphs=False))
    return out


def card_budgets(config: EngineConfig) -> tuple[int | None, ...]:
    n, b = config.cards, config.gpu_memory_budget
    return tuple(b) if isinstance(b, tuple) else (None if b is None else b // n,) * n


class _Process:
    """A stage's process, started as ``python -m engine.parallel.worker`` (so that nothing of the
    caller's main module runs again in it), with a socket of its own as its control pipe."""

    def __init__(self, rank: int) -> None:
        here, there = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.popen = subprocess.Popen([sys.executable, "-m", "engine.parallel.worker", str(there.fileno())],
                                      pass_fds=(there.fileno(),), env=env, stdin=subprocess.DEVNULL)
        there.close()
        self.conn = Connection(here.detach())
        self.pid = self.popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()


class _Worker:
    def __init__(self, rank: int, proc: _Process) -> None:
        self.rank, self.proc, self.conn = rank, proc, proc.conn
        self.inbox: deque[tuple] = deque()


class Pipeline:
    """Rank 0's handle on the other stages; ``forward`` is the first stage model's ``downstream``."""

    def __init__(self, config: EngineConfig, plan: PipelinePlan | None, stage_cfgs: list[EngineConfig], path: Path,
                 device: torch.device, spec: ModelSpec, mode: str = "layers") -> None:
        """``mode`` "layers": a pipeline of ``plan``'s stages; "experts": expert parallel over
        ``len(stage_cfgs)`` cards (engine/parallel/experts.py)."""
        self.plan, self.device, self.spec, self.mode = plan, device, spec, mode
        self.size = len(stage_cfgs)
        self.microbatches: int | None = config.pipeline_microbatches     # None: auto (microbatches_for)
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.failed: str | None = None
        self.workers: list[_Worker] = []
        self._closed = False
        self._ctrl = None
        if dist.is_initialized():
            raise ConfigError("another model spread over several GPUs is loaded in this process; close it before "
                              "loading this one")
        self._owns_group = False
        init = f"tcp://127.0.0.1:{_free_port()}"
        try:
            atexit.register(self.close)
            for rank in range(1, self.size):
                w = _Worker(rank, _Process(rank))
                self.workers.append(w)
                self._send(w, dict(rank=rank, world=self.size, init=init, backend=self.backend, mode=mode,
                                   config=stage_cfgs[rank], path=str(path), plan=plan, parent=os.getpid()))
            for w in self.workers:
                self._expect(w, "hello")              # the process runs and imported the engine
            dist.init_process_group(self.backend, init_method=init, rank=0, world_size=self.size,
                                    timeout=timedelta(seconds=JOIN_TIMEOUT_S))
            self._owns_group = True
            self._ctrl = dist.new_group(backend="gloo") if self.backend != "gloo" else None
        except BaseException:
            self.close()
            raise

    # ---- waiting on the workers --------------------------------------------------------------------
    def _where(self, rank: int) -> str:
        if self.mode == "experts":
            from engine.parallel.experts import ExpertShard
            return ExpertShard(rank, self.size, self.spec.num_experts).describe()
        s = self.plan.stages[rank]
        return f"pipeline stage {rank} of {self.plan.size} (layers {s.layers})"

    def _drain(self, w: _Worker) -> None:
        """Move what worker ``w`` sent into its inbox; an error it reports stops the pipeline."""
        while w.conn.poll():
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "error":
                _, kind, text = msg
                cls = getattr(errors, kind, None)
                text = f"{self._where(w.rank)}: {text}"
                if isinstance(cls, type) and issubclass(cls, StrataError) and not issubclass(cls, PipelineError):
                    self._fail(text, cls)
                self._fail(f"{text}; every stage was stopped — load the model again")
            w.inbox.append(msg)

    def _check(self) -> None:
        """Raise (and stop every stage) when a worker reported an error or its process ended."""
        if self.failed is not None:
            raise PipelineError(self.failed)
        for w in self.workers:
            self._drain(w)
            if not w.proc.is_alive():
                self._drain(w)                    # its last words, if it had time to say why
                code = w.proc.exitcode
                how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
                self._fail(f"{self._where(w.rank)} (process {w.proc.pid}) ended unexpectedly ({how}); every stage "
                           "was stopped — load the model again")

    def _fail(self, message: str, cls: type[StrataError] = PipelineError) -> None:
        self.failed = message
        self._stop_workers(kill=True)
        raise cls(message)

    def _wait(self, work) -> None:
        """Wait for an asynchronous torch.distributed operation, watching the workers meanwhile.

        NCCL's operations say when they are done, so the wait polls the workers between its looks.
        Gloo's sends never say so before they are waited on; a gloo operation is waited on at once
        and fails when a peer's connection closes, which is when the workers are looked at."""
        if self.backend == "gloo":
            try:
                work.wait()
            except RuntimeError as e:
                self._broken(e)
            return
        n = 0
        while not work.is_completed():
            self._check()
            n += 1
            if n > _SPIN:
                time.sleep(0.0005)
        work.wait()

    def _broken(self, error: Exception) -> None:
        """A link to another stage failed: name the stage that ended (given a moment to be seen)."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            self._check()
            time.sleep(0.01)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self._fail(f"the pipeline's link to another stage failed ({first}); every stage was stopped — load the "
                   "model again")

    def _expect(self, w: _Worker, kind: str) -> tuple:
        """The next message of worker ``w``, which must be a ``kind`` reply (its error raises)."""
        n = 0
        while not w.inbox:
            self._check()
            n += 1
            if n > _SPIN:
                time.sleep(0.0005)
        got = w.inbox.popleft()
        if got[0] != kind:
            self._fail(f"{self._where(w.rank)} answered {got[0]!r} where {kind!r} was due; every stage was "
                       "stopped — load the model again")
        return got

    def _send(self, w: _Worker, msg: tuple) -> None:
        try:
            w.conn.send(msg)
        except (BrokenPipeError, ConnectionError, EOFError, OSError):
            self._check()
            self._fail(f"{self._where(w.rank)} (process {w.proc.pid}) stopped answering; every stage was stopped — "
                       "load the model again")

    # ---- load ----------------------------------------------------------------------------------------
    def agree_blocks(self, blocks: int) -> int:
        """The KV blocks every stage allocates: the fewest any stage can hold."""
        t = torch.tensor([blocks], dtype=torch.int64)
        self._wait(dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._ctrl, async_op=True))
        return int(t.item())

    def wait_loaded(self) -> None:
        for w in self.workers:
            self._expect(w, "loaded")

    # ---- steps ---------------------------------------------------------------------------------------
    def forward(self, model, batch, cache, acquire=None) -> torch.Tensor:
        """One step of the whole model from the first stage (its ``forward``): logits [B', V].

        With micro-batches the step's sequences go down the stages in groups, so that a later stage
        works on one group while an earlier one works on the next; each group is the same step for
        its sequences, so the logits are those of the whole batch, in its order."""
        self._check()
        with self.step_guard():
            return self._forward(model, batch, cache, acquire)

    @contextlib.contextmanager
    def step_guard(self):
        """A step that fails on this card after the others were told to run it leaves them waiting
        for what will not come: the pipeline stops, and the failure says so in one line."""
        try:
            yield
        except PipelineError:
            raise
        except BaseException as e:
            if self.failed is None:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                self.failed = (f"the engine's own card failed during a step ({type(e).__name__}: {first}); every stage "
                               "was stopped — load the model again")
                self._stop_workers(kill=True)
            if isinstance(e, Exception) and not isinstance(e, StrataError):
                raise PipelineError(self.failed) from None
            raise

    def _forward(self, model, batch, cache, acquire) -> torch.Tensor:
        groups = self._split(batch, cache)
        backs = []
        for tag, g in enumerate(groups):          # posted first: the last stage never waits on rank 0
            back = torch.empty(2, g.parts.num_tokens, model.spec.hidden, dtype=model.dtype, device=model.device)
            backs.append((back, dist.irecv(back, src=self.plan.size - 1, tag=tag)))
        sends = []
        for tag, g in enumerate(groups):
            for w in self.workers:
                self._send(w, ("step", g.parts, tag))
            x, out = model.layers(model.embed(g), None, g, cache, acquire)
            act = torch.stack([x, out if out is not None else torch.zeros_like(x)]).contiguous()   # [2, T, D]
            sends.append((act, dist.isend(act, dst=1, tag=tag)))
        for _, work in sends:
            self._wait(work)
        logits = []
        for g, (back, work) in zip(groups, backs):
            self._wait(work)
            logits.append(model.head(back[0], back[1], g))
        return logits[0] if len(logits) == 1 else torch.cat(logits, 0)

    def _split(self, batch, cache) -> list:
        """The step as micro-batches: ``microbatches`` groups of whole sequences, even in tokens."""
        parts = batch.parts
        n = min(self.microbatches_for(batch), len(parts.parts))
        if n <= 1:
            return [batch]
        total = parts.num_tokens
        groups: list[list] = [[]]
        done = 0
        for p in parts.parts:
            if groups[-1] and done >= total * len(groups) / n and len(groups) < n:
                groups.append([])
            groups[-1].append(p)
            done += len(p.ids)
        windowed = bool(cache.window_blocks)
        return [BatchParts(tuple(g), parts.decode, parts.every_row).build(cache.block_size, self.device, windowed)
                for g in groups]

    def microbatches_for(self, batch) -> int:
        """Micro-batches of a step: as set, or (auto) one per stage for a decode step on GPUs, whose
        cards (and their links to host memory) then work at once; one on the CPU, whose stages share
        its cores."""
        if batch.parts is None:
            return 1
        if self.microbatches is not None:
            return self.microbatches
        return self.plan.size if self.device.type == "cuda" and batch.parts.decode else 1

    def reconfigure(self, options: dict, notes: dict, applied: dict[str, str]) -> None:
        """Apply the live options of the stages' own cards on every other stage; their answers join
        ``applied`` where they differ from the first stage's."""
        stage_options = {k: v for k, v in options.items() if k in _STAGE_OPTIONS}
        if not stage_options:
            return
        for w in self.workers:
            self._send(w, ("reconfigure", stage_options, notes))
        refused = []
        for w in self.workers:
            got = self._expect(w, "reconfigured")
            if got[1] is not None:
                refused.append(f"stage {w.rank}: {got[1]}")
                continue
            for k, text in got[2].items():
                if applied.get(k) != text:
                    applied[k] = f"{applied.get(k, '')}; stage {w.rank}: {text}".lstrip("; ")
        if refused:
            raise ReconfigureError("; ".join(refused))

    def stage_stats(self) -> list[StageStats]:
        """Every other stage's counters and memory, in stage order."""
        if self.failed is not None:
            return []
        for w in self.workers:
            self._send(w, ("stats",))
        return [self._expect(w, "stats")[1] for w in self.workers]

    # ---- shutdown ------------------------------------------------------------------------------------
    def _stop_workers(self, kill: bool = False) -> None:
        for w in self.workers:
            if not kill and w.proc.is_alive():
                try:
                    w.conn.send(("close",))
                except (BrokenPipeError, ConnectionError, EOFError, OSError):
                    pass
        deadline = time.monotonic() + (0.0 if kill else 20.0)
        for w in self.workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(5.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(5.0)
            w.conn.close()
        self.workers = []
        if self._owns_group and dist.is_initialized():
            self._owns_group = False
            try:
                dist.destroy_process_group()
            except Exception:          # a group whose peers are gone: nothing left to release
                pass

    def close(self) -> None:
        """Stop every other stage (idempotent)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._stop_workers()

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]


# the live options each stage applies to its own card (engine/live.py apply_to_stage)
_STAGE_OPTIONS = ("expert_pool_size", "prefetch_depth", "expert_policy", "expert_reads", "cold_experts",
                  "kv_cache_dtype")


def load_expert_parallel(config: EngineConfig, spec: ModelSpec, source: TensorSource, tokenizer: Tokenizer | None,
                         path: Path, notes: tuple[str, ...], model_cls):
    """Card 0 of expert parallel over ``config.expert_parallel`` GPUs (CPU processes on the CPU), with
    the other cards' processes started and loaded beside it (engine/parallel/experts.py); ``model_cls``
    as for :func:`load_pipeline`."""
    from engine.parallel.experts import ExpertShard, ExpertsOnCards, check_shards
    n = config.expert_parallel
    device = _devices(config, n, "expert_parallel")
    check_shards(spec.num_experts, spec.top_k, n)
    budgets = card_budgets(config)
    notes = list(notes)
    if config.cold_experts != "bus":
        notes.append("cold_experts is bus with expert parallel: each card brings its missing experts over its own link")
    cfgs = [config.replace(device="cpu" if device.type == "cpu" else f"cuda:{r}", gpu_memory_budget=budgets[r],
                           cuda_graphs=False, cold_experts="bus") for r in range(n)]
    group = Pipeline(config, None, cfgs, path, device, spec, mode="experts")
    try:
        graphs = ("CUDA graphs are off: expert parallel runs its decode steps eagerly",) \
            if device.type == "cuda" and config.cuda_graphs is not False else ()
        loaded = model_cls(cfgs[0], spec, source, tokenizer, path, tuple(notes) + graphs,
                             shard=ExpertShard(0, n, spec.num_experts))
        group.wait_loaded()
    except BaseException:
        group.close()
        raise
    loaded.pipeline = group
    loaded.model.expert_parallel = ExpertsOnCards(group)
    return _checked(loaded, source, path)


def _checked(loaded, source: TensorSource, path: Path):
    """``loaded``, once a converted folder's expert layout is checked against it (closed if it fails)."""
    manifest = getattr(source, "manifest", None)
    if manifest is not None:
        try:
            manifest.check_layout(loaded.layout, path)
        except BaseException:
            loaded.close()
            raise
    return loaded


def _devices(config: EngineConfig, n: int, name: str) -> torch.device:
    """The device type of the cards (checked to be there) and the checks the parallel modes share."""
    from engine.placement import resolve_device
    device = resolve_device(config.device)
    if device.type == "cuda":
        if config.device not in ("auto", "cuda"):
            raise ConfigError(f"device={config.device} names one GPU but {name}={n} uses GPUs 0..{n - 1}; "
                              "use --device cuda")
        if torch.cuda.device_count() < n:
            raise ConfigError(f"{name}={n} needs {n} GPUs but {torch.cuda.device_count()} "
                              f"{'is' if torch.cuda.device_count() == 1 else 'are'} visible; lower "
                              f"--{name.replace('_', '-')} or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    for option in ("routing_profile", "record_routing"):
        if getattr(config, option):
            raise ConfigError(f"{option} does not work with {name} yet; drop --{option.replace('_', '-')} "
                              f"or load with --{name.replace('_', '-')} 1")
    return device


def load_pipeline(config: EngineConfig, spec: ModelSpec, source: TensorSource, tokenizer: Tokenizer | None,
                  path: Path, notes: tuple[str, ...], model_cls):
    """The first stage of a pipeline over ``config.pipeline_parallel`` GPUs (CPU processes on the
    CPU), with the other stages started and loaded beside it; ``model_cls`` is the LoadedModel class
    (given by engine.loading, which this module does not import)."""
    from engine.placement import expert_layout, resolve_dtype
    n = config.pipeline_parallel
    device = _devices(config, n, "pipeline_parallel")
    dtype = resolve_dtype(config.dtype, device)
    layout = expert_layout(config, spec, dtype)
    manifest = getattr(source, "manifest", None)
    resident = config.resident_weights if config.resident_weights != "auto" else \
        (manifest.resident if manifest is not None else "bf16")
    elem = torch.empty((), dtype=dtype).element_size()
    plan = plan_pipeline(spec, n, elem, resident, layout.nbytes, card_budgets(config))
    cfgs = stage_configs(config, plan, device)
    pipeline = Pipeline(config, plan, cfgs, path, device, spec)
    try:
        ctx = StageContext(spec, plan, 0, pipeline.agree_blocks)
        first = plan.stages[0]
        graphs = ("CUDA graphs are off: the stages of a pipeline run their decode steps eagerly",) \
            if device.type == "cuda" and config.cuda_graphs is not False else ()
        loaded = model_cls(cfgs[0], stage_spec(spec, first), StageSource(source, first), tokenizer, path,
                             notes + graphs, stage=ctx)
        pipeline.wait_loaded()
    except BaseException:
        pipeline.close()
        raise
    loaded.pipeline = pipeline
    loaded.model.pipeline = pipeline
    return _checked(loaded, source, path)

