"""The first stage's side of a pipeline: it starts one process per other stage, hands each step's
activations down the stages over torch.distributed, and stops them all when one fails.

Wiring (N stages, rank 0 is the engine's own process):

* control: one pipe per worker (engine/parallel/processes.py), carrying pickled messages (a step's
  batch description, live options, stats requests, close, the stages' KV claims at load) and their
  replies (or a worker's error);
* rendezvous: rank 0 holds the TCP store; each worker marks itself there just before it joins the
  process group, and rank 0 joins only once all have, watching their processes meanwhile, so a stage
  that dies before it connects fails the load at once, named, with its exit code and last stderr line.
  The default group (only the rendezvous) waits ``rendezvous_timeout_s`` at most; the links below
  wait as long as a step may take (``link_timeout_s``);
* activations: ``torch.distributed`` point to point, NCCL between GPUs (gloo on the CPU), on two
  groups of their own: ``links`` carries rank 0 -> 1 -> ... -> N-1 (the residual stream and the last
  block's output ``[2, T, D]`` after each stage's layers), ``back`` (ranks 0 and N-1 only) carries
  the last stage's result back to rank 0, which adds them and runs the LM head. Rank 0 posts its
  receive on ``back`` before it sends on ``links``: on separate communicators, that receive cannot
  hold up the send (NCCL runs one communicator's operations in order, even with two stages);
* warm-up at load: NCCL builds a pair's communicator on the pair's first operation, both ends
  blocking; a step's first receive posted on rank 0 before its first send would make the pairs wait
  on each other in a cycle. Before any step each edge carries one value in an order without a cycle
  (0 -> 1, 1 -> 2, ..., N-2 -> N-1 on ``links``, then N-1 -> 0 on ``back``): every communicator exists
  before a step posts anything. Expert parallel builds its one communicator with a broadcast. Rank 0
  does its share on a thread of its own, so that it watches its workers meanwhile (a communicator
  waits for a peer that died without a limit), and gives it ``rendezvous_timeout_s``.

Every wait of rank 0 polls its workers: a worker that reports an error or whose process ended
stops the pipeline with one :class:`PipelineError` (or the worker's own error, at load), and no
process is left behind, also when the engine is collected without a close or the interpreter ends.
Workers watch their parent the same way (engine/parallel/worker.py).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from engine import errors
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.errors import ConfigError, PipelineError, StrataError
from engine.parallel.changes import StageChanges
from engine.parallel.plan import PipelinePlan
from engine.parallel.processes import WORKER_ARGV, Crew, StageProcess, Worker
from engine.parallel.stages import KVClaim
from engine.runner.batch import BatchParts
from engine.telemetry import StageStats

LINK_TIMEOUT_S = 60.0 * 10          # the longest a link between stages may wait (a slow step)
RENDEZVOUS_TIMEOUT_S = 60.0         # the longest joining the process group may take once every stage is there
_SPIN = 2000                        # polls without sleeping before a wait starts to sleep between polls


def _forget_failed_join() -> None:
    """A join that failed still advanced torch's count of groups made, which names the next default
    group: a group of this process alone, made and destroyed at once, sets it back, so that the next
    pipeline's group is named as its new stages name theirs."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.destroy_process_group()


class Pipeline:
    """Rank 0's handle on the other stages; ``forward`` is the first stage model's ``downstream``."""

    def __init__(self, config: EngineConfig, plan: PipelinePlan | None, stage_cfgs: list[EngineConfig], path: Path,
                 device: torch.device, spec: ModelSpec, mode: str = "layers", *,
                 rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S, link_timeout_s: float = LINK_TIMEOUT_S,
                 worker_argv: tuple[str, ...] = WORKER_ARGV) -> None:
        """``mode`` "layers": a pipeline of ``plan``'s stages; "experts": expert parallel over
        ``len(stage_cfgs)`` cards (engine/parallel/experts.py). ``worker_argv``: what each stage's
        process runs (the worker module; tests start others)."""
        self.plan, self.device, self.spec, self.mode = plan, device, spec, mode
        self.size = len(stage_cfgs)
        self.microbatches: int | None = config.pipeline_microbatches     # None: auto (microbatches_for)
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.failed: str | None = None
        self.first = None             # the first stage's LoadedModel, once loaded (live options apply to it last)
        self.warmed_edges: tuple[tuple[int, int], ...] = ()    # (from, to) in the order the warm-up used them
        self.changes = StageChanges(stage_cfgs[0])     # the stages' live options
        self.links = self.back = None
        self._joined = False
        self._rendezvous_s = rendezvous_timeout_s
        if dist.is_initialized():
            raise ConfigError("another model spread over several GPUs is loaded in this process; close it before "
                              "loading this one")
        self._crew = Crew()
        # stops the stages when this object is collected without close(), and at the interpreter's exit
        self._finalizer = weakref.finalize(self, self._crew.stop)
        try:
            self._start(stage_cfgs, path, rendezvous_timeout_s, link_timeout_s, worker_argv)
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> list[Worker]:
        return self._crew.workers

    def _start(self, stage_cfgs: list[EngineConfig], path: Path, rendezvous_s: float, link_s: float,
               argv: tuple[str, ...]) -> None:
        store = dist.TCPStore("127.0.0.1", 0, self.size, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=link_s))
        for rank in range(1, self.size):
            w = Worker(rank, StageProcess(argv))
            self.workers.append(w)
            self.send(w, dict(rank=rank, world=self.size, store=store.port, backend=self.backend, mode=self.mode,
                               config=stage_cfgs[rank], path=str(path), plan=self.plan, parent=os.getpid(),
                               rendezvous_s=rendezvous_s, link_s=link_s))
        joined = [f"joined/{r}" for r in range(1, self.size)]
        n, deadline = 0, time.monotonic() + link_s
        while not store.check(joined):            # every worker runs, imported the engine, and is joining
            self._check()
            if time.monotonic() > deadline:
                late = [w.rank for w in self.workers if not store.check([f"joined/{w.rank}"])]
                self.fail(f"{self._where(late[0])} did not start within {link_s:g} s; every stage was stopped — "
                           "load the model again")
            n += 1
            time.sleep(0.0005 if n < _SPIN else 0.01)
        try:
            dist.init_process_group(self.backend, store=store, rank=0, world_size=self.size,
                                    timeout=timedelta(seconds=rendezvous_s))
        except RuntimeError as e:                 # a stage ended (or hung) while joining
            _forget_failed_join()
            self._broken(e, f"the stages did not join the process group within {rendezvous_s:g} s")
        self._crew.owns_group = True
        self._joined = True
        self.links = dist.new_group(timeout=timedelta(seconds=link_s))
        self.back = dist.new_group(ranks=[0, self.size - 1], timeout=timedelta(seconds=link_s))

    # ---- waiting on the workers --------------------------------------------------------------------
    def _where(self, rank: int) -> str:
        if self.mode == "experts":
            from engine.parallel.experts import ExpertShard
            return ExpertShard(rank, self.size, self.spec.num_experts).describe()
        s = self.plan.stages[rank]
        return f"pipeline stage {rank} of {self.plan.size} (layers {s.layers})"

    def _drain(self, w: Worker) -> None:
        """Move what worker ``w`` sent into its inbox, up to an error it reports (kept in ``w.error``)."""
        while w.error is None and w.conn.poll():
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "error":
                w.error = msg[1:]
            else:
                w.inbox.append(msg)

    def _check(self) -> None:
        """Raise (and stop every stage) when a worker reported an error or its process ended."""
        if self.failed is not None:
            raise PipelineError(self.failed)
        for w in self.workers:
            self._drain(w)
        for w in self.workers:
            if w.error is None and not w.proc.is_alive():
                self._drain(w)                    # its last words, if it had time to say why
            if w.error is not None:
                kind, text = w.error
                if kind == "PipelineError":           # not the engine's own words: perhaps a link that broke
                    self._name_an_ended_stage(w)
                cls = getattr(errors, kind, None)
                text = f"{self._where(w.rank)}: {text}"
                if isinstance(cls, type) and issubclass(cls, StrataError) and not issubclass(cls, PipelineError):
                    self.fail(text, cls)
                self.fail(f"{text}; every stage was stopped — load the model again")
            if not w.proc.is_alive():
                self._ended(w)

    def _name_an_ended_stage(self, reporting: Worker, grace_s: float = 0.5) -> None:
        """A stage reported a failure that may be another's doing (its link to a stage that was killed
        broke first): a stage whose process ends without a word within ``grace_s`` is named instead."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            for o in self.workers:
                if o is not reporting and o.error is None and not o.proc.is_alive():
                    self._drain(o)
                    if o.error is None:
                        self._ended(o)
            time.sleep(0.01)

    def _ended(self, w: Worker) -> None:
        what = "ended unexpectedly" if self._joined else "ended before it joined the pipeline"
        self.fail(f"{self._where(w.rank)} (process {w.proc.pid}) {what} ({w.proc.how_it_ended()}); every stage "
                   "was stopped — load the model again")

    def fail(self, message: str, cls: type[StrataError] = PipelineError) -> None:
        """Stop every stage and raise ``cls(message)``: the pipeline cannot go on."""
        self.failed = message
        self._crew.stop(kill=True)
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

    def _broken(self, error: Exception, what: str | None = None) -> None:
        """A link to another stage failed: name the stage that ended (given a moment to be seen).

        The stages still running report that their link broke too; a stage whose process ended
        without a word is the cause, named before them."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if self.failed is not None:
                raise PipelineError(self.failed)
            for w in self.workers:
                self._drain(w)
                if w.error is None and not w.proc.is_alive():
                    self._drain(w)
                    if w.error is None:
                        self._ended(w)
            if all(w.error is not None for w in self.workers):
                break
            time.sleep(0.01)
        self._check()
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        what = what or "the pipeline's link to another stage failed"
        self.fail(f"{what} ({first}); every stage was stopped — load the model again")

    def expect(self, w: Worker, kind: str) -> tuple:
        """The next message of worker ``w``, which must be a ``kind`` reply (its error raises)."""
        n = 0
        while not w.inbox:
            self._check()
            n += 1
            if n > _SPIN:
                time.sleep(0.0005)
        got = w.inbox.popleft()
        if got[0] != kind:
            self.fail(f"{self._where(w.rank)} answered {got[0]!r} where {kind!r} was due; every stage was "
                       "stopped — load the model again")
        return got

    def send(self, w: Worker, msg: tuple) -> None:
        """Send ``msg`` to worker ``w``; a worker that stopped answering fails the pipeline."""
        try:
            w.conn.send(msg)
        except (BrokenPipeError, ConnectionError, EOFError, OSError):
            self._check()
            self.fail(f"{self._where(w.rank)} (process {w.proc.pid}) stopped answering; every stage was stopped — "
                       "load the model again")

    # ---- load ----------------------------------------------------------------------------------------
    def share_claims(self, own: KVClaim) -> list[KVClaim]:
        """Every stage's KV claim, in stage order, handed to every stage (each then decides the blocks
        and the context alike, stages.agree_kv). The workers send theirs over their pipes, so the wait
        watches their processes (a slow load included)."""
        claims = [own, *(self.expect(w, "kv_claim")[1] for w in self.workers)]
        for w in self.workers:
            self.send(w, ("kv_claims", claims))
        return claims

    def wait_loaded(self) -> None:
        for w in self.workers:
            self.expect(w, "loaded")

    def warm_up(self) -> None:
        """Build every link's communicator before the first step: down the stages one edge after the
        other in an order without a cycle (see the module docstring; ``warmed_edges`` lists them), or,
        for expert parallel, one broadcast over every card. Rank 0's side runs on a thread of its own
        while this one watches the workers: a stage whose process ends fails the load at once (an NCCL
        communicator waits for its peers without a limit), and the whole takes ``rendezvous_s`` at most."""
        for w in self.workers:
            self.send(w, ("warm_up",))
        failure: list[BaseException] = []
        thread = threading.Thread(target=self._first_uses, args=(failure,), name="pipeline-warm-up", daemon=True)
        thread.start()
        deadline = time.monotonic() + self._rendezvous_s
        while thread.is_alive():
            self._check()
            if time.monotonic() > deadline:
                late = next((w for w in self.workers if not any(m[0] == "warmed" for m in w.inbox)), self.workers[-1])
                self.fail(f"{self._where(late.rank)} (process {late.proc.pid}) did not build its links within "
                           f"{self._rendezvous_s:g} s; every stage was stopped — load the model again")
            thread.join(0.005)
        if failure:
            self._broken(failure[0])
        edges = [self.expect(w, "warmed")[1] for w in self.workers]
        self.warmed_edges = ((0, 1), *map(tuple, edges)) if self.mode == "layers" else ()

    def _first_uses(self, failure: list[BaseException]) -> None:
        """Rank 0's share of the warm-up (on the warm-up thread); an error goes to ``failure``."""
        try:
            token = torch.zeros(1, device=self.device)
            if self.mode == "experts":
                dist.broadcast(token, src=0, group=self.links)
            else:
                dist.send(token, dst=1, group=self.links)
                dist.recv(token, src=self.size - 1, group=self.back)
            token.cpu()                           # NCCL's operations are done once the stream is
        except BaseException as e:                # handed to the thread that watches the workers
            failure.append(e)

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
                self._crew.stop(kill=True)
            if isinstance(e, Exception) and not isinstance(e, StrataError):
                raise PipelineError(self.failed) from None
            raise

    def _forward(self, model, batch, cache, acquire) -> torch.Tensor:
        groups = self._split(batch, cache)
        backs = []
        for tag, g in enumerate(groups):          # posted first, on ``back``: the last stage never waits on rank 0
            back = torch.empty(2, g.parts.num_tokens, model.spec.hidden, dtype=model.dtype, device=model.device)
            backs.append((back, dist.irecv(back, src=self.plan.size - 1, tag=tag, group=self.back)))
        sends = []
        for tag, g in enumerate(groups):
            for w in self.workers:
                self.send(w, ("step", g.parts, tag))
            x, out = model.layers(model.embed(g), None, g, cache, acquire)
            act = torch.stack([x, out if out is not None else torch.zeros_like(x)]).contiguous()   # [2, T, D]
            sends.append((act, dist.isend(act, dst=1, tag=tag, group=self.links)))
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

    def reconfigure(self, options: dict, notes: dict) -> dict[str, str]:
        """Apply the live options of the stages' own cards on every stage, or on none
        (engine/parallel/changes.py); a stopped pipeline raises its PipelineError."""
        self._check()
        return self.changes.apply(self, options, notes)

    def ask_all(self, msg: tuple, kind: str) -> list[tuple]:
        """Send ``msg`` to every worker, then each one's ``kind`` reply, in rank order."""
        for w in self.workers:
            self.send(w, msg)
        return [self.expect(w, kind) for w in self.workers]

    def stage_stats(self) -> list[StageStats]:
        """Every other stage's counters and memory, in stage order."""
        if self.failed is not None:
            return []
        return [got[1] for got in self.ask_all(("stats",), "stats")]

    # ---- shutdown ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every other stage (idempotent)."""
        self._finalizer()

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]
