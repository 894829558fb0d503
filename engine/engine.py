"""``LLMEngine``: load a model, accept requests, and advance them one step at a time.

Not thread-safe: one thread drives it (the CLI, the workbench's bridge thread, the HTTP server's
engine loop). A step is schedule -> run -> postprocess.
"""
from __future__ import annotations

import dataclasses
import gc
import operator
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.errors import ConfigError, DeviceOutOfMemoryError
from engine import stats as stats_mod
from engine.live import LiveSettings
from engine.checkpoint.integrity import Progress
from engine.guided import GuideCompiler
from engine.loading import LoadedModel, load_model
from engine.outputs import RequestDelta, TokenLogprob
from engine.request import Request, Status
from engine.sampling import SamplingParams, check_stop, make_generator, stop_holdback
from engine.scheduler import SchedulerOutput
from engine.telemetry import EngineStats
from engine.tokenizer import IncrementalDetokenizer


def _token_id(t: object) -> int | None:
    """``t`` as an int when it is a whole number (an int, a numpy or torch integer), else None."""
    if isinstance(t, bool):
        return None
    try:
        return operator.index(t)
    except TypeError:
        return None


def _earliest_stop(text: str, prev: int, stop: tuple[str, ...]) -> int | None:
    """:func:`check_stop` over ``text`` whose first ``prev`` characters were checked before, looking back only
    as far as the longest stop string reaches (so a token's check costs the same however long the text)."""
    start = max(0, prev - max(map(len, stop)) + 1)
    cut = check_stop(text[start:prev], text[prev:], stop)
    return None if cut is None else start + cut


@dataclass
class _Ahead:
    """A decode step launched without reading it back: its schedule, its queued sampling, when."""

    sched: SchedulerOutput
    queued: Any                 # the runner's queued sampling (None: no row samples)
    launched: float

    @property
    def requests(self) -> list[Request]:
        return [s.request for s in self.sched.seqs]

    def live(self) -> bool:
        """Whether a request it ran for is still unfinished (else its tokens go to no one)."""
        return any(s.request.status is not Status.FINISHED for s in self.sched.seqs)


def _merged(deltas: list[RequestDelta]) -> RequestDelta:
    """One request's deltas as one, in order: the last one's counts and end, every one's ids and text."""
    last = deltas[-1]
    return dataclasses.replace(last, new_token_ids=tuple(t for d in deltas for t in d.new_token_ids),
                               new_text="".join(d.new_text for d in deltas),
                               logprobs=tuple(lp for d in deltas for lp in d.logprobs),
                               ttft_ms=next((d.ttft_ms for d in deltas if d.ttft_ms is not None), None))


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None,
                 progress: Progress | None = None) -> None:
        """Load ``config.model``; or run an already built ``loaded`` model (e.g. one made in memory).

        ``progress(done, total, label)`` follows the long parts of a load (a converted folder's checksums).
        """
        self.loaded: LoadedModel = loaded or load_model(config, progress)
        self.config = self.loaded.config          # as resolved at load (pool shares in bytes)
        self.tokenizer = self.loaded.tokenizer
        self.model_info = self.loaded.info
        self.scheduler = self.loaded.scheduler
        self.runner = self.loaded.runner
        self.counters = stats_mod.Counters()
        self.live = LiveSettings(self)
        self._requests: dict[str, Request] = {}
        # a model without a tokenizer (built in memory) takes and returns token ids only
        self.eos_ids = self.tokenizer.eos_token_ids if self.tokenizer else frozenset()
        self._next_id = 0
        self.guides = self._guide_compiler()
        self.runner.guides = self.guides
        self._closed: EngineStats | None = None     # the counters as the engine closed (see close)
        self._ahead: _Ahead | None = None           # a decode step launched, its tokens not read back yet
        self._last_read = 0.0                       # when the last step's tokens were read back
        self._held: list[RequestDelta] = []         # output read back between steps (drain), not yet returned
        self.steps_ahead = 0                        # decode steps launched before the last one was read back
        # a pipeline's or an expert-parallel group's steps go to other processes as host-side batches
        self.runner.overlap = self.config.overlap_steps and self.loaded.stage is None and self.loaded.shard is None

    def _guide_compiler(self) -> GuideCompiler | None:
        """Guides need the model's tokens as text; llguidance reads them from its tokenizer.json."""
        if self.tokenizer is None:
            return None
        folder = self.model_info.path

        def tokenizer_json() -> str:
            if not folder:
                raise ConfigError("this model was built in memory, without a folder holding its tokenizer.json, so "
                                  "its output cannot follow a guide; load it from its model folder")
            try:
                return (Path(folder) / "tokenizer.json").read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"a guide needs the model's tokenizer.json, which could not be read ({exc}); "
                                  "restore it in the model folder") from None
        n_vocab = max(self.loaded.spec.vocab_size, self.tokenizer.vocab_size)
        special = self.tokenizer.special_tokens.as_template_vars().values()
        return GuideCompiler(tokenizer_json, n_vocab, self.eos_ids, special)

    # ---- requests -----------------------------------------------------------------------------
    @property
    def context_tokens(self) -> int:
        """The context as loaded (max_model_len): prompt and reply together never exceed it."""
        return self.loaded.max_model_len

    def add_request(self, request_id: str | None, prompt: str | Sequence[int], params: SamplingParams) -> str:
        """Queue a request; ``prompt`` is text (encoded with special tokens) or token ids.

        Raises a ConfigError (and queues nothing) when :meth:`validate_request` refuses it.
        """
        self._require_open()
        if request_id is None:
            request_id, self._next_id = f"req-{self._next_id}", self._next_id + 1
        if request_id in self._requests:
            raise ConfigError(f"request id '{request_id}' is already in use; give each request its own id")
        ids = self.validate_request(prompt, params)
        req = Request(request_id, ids, params, self.loaded.max_model_len,
                      make_generator(params.seed, self.loaded.device),
                      IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None,
                      guide=self.guides.matcher(params.guide) if params.guide is not None else None)
        if params.stop and params.stop_scope is not None:      # stops apply to the answer's text only
            req.stop_gate = params.stop_scope.gate()
        if params.guide is not None and getattr(params.stop_scope, "holds_guide", False):
            req.guide_gate = params.stop_scope.gate()          # the guide waits for the answer too
        self._requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def validate_request(self, prompt: str | Sequence[int], params: SamplingParams) -> list[int]:
        """The prompt's token ids, or a ConfigError saying why the request cannot run; changes nothing."""
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"sampling parameters must be a SamplingParams (got {type(params).__name__})")
        ids = self._prompt_ids(prompt)
        self._check_prompt(ids)
        vocab = self.loaded.spec.vocab_size
        bad = next((t for t in params.stop_token_ids if t >= vocab), None)
        if bad is not None:
            raise ConfigError(f"stop token id {bad} is outside the vocabulary (0..{vocab - 1}); "
                              "check stop_token_ids")
        if params.guide is not None:
            if self.guides is None:
                raise ConfigError("this model has no tokenizer, so its output cannot follow a guide (a JSON schema, a "
                                  "pattern or a grammar); load a model folder with a tokenizer.json, or drop the guide")
            self.guides.check(params.guide)
        return ids

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("this model has no tokenizer; pass token ids instead of text")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (bytes, bytearray, dict)) or not isinstance(prompt, Iterable):
            raise ConfigError(f"a prompt is text or a list of token ids (got {type(prompt).__name__})")
        given = list(prompt)
        ids = [_token_id(t) for t in given]
        if None in ids:
            raise ConfigError(f"a prompt's token ids must be whole numbers (found {given[ids.index(None)]!r}); "
                              "pass text or a list of ints")
        return ids

    def _check_prompt(self, ids: list[int], scoring: bool = False) -> None:
        """``scoring``: the ids are scored, not continued, so they may fill the whole context."""
        if not ids:
            raise ConfigError("the prompt is empty; give at least one token of text")
        vocab = self.loaded.spec.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ConfigError(f"token id {bad} is outside the vocabulary (0..{vocab - 1}); check the prompt's token ids")
        limit = self.loaded.max_model_len
        if scoring and len(ids) > limit:
            raise ConfigError(f"the text has {len(ids)} tokens but the context holds {limit}; score {limit} tokens "
                              "or fewer at a time")
        if not scoring and len(ids) >= limit:
            raise ConfigError(f"the prompt has {len(ids)} tokens but the context holds {limit}, prompt and reply "
                              f"together; shorten the prompt to {limit - 1} tokens or fewer")

    def abort(self, request_id: str) -> None:
        """Ask a request to stop: it ends with finish reason "abort" at the start of the next step."""
        req = self._requests.get(request_id)
        if req is not None:
            req.abort_requested = True

    def abort_now(self, request_id: str) -> RequestDelta | None:
        """End a request at once, between steps, and free its cache; returns its final delta (None if gone),
        with any output read back for it since the last step (:meth:`drain`) in front."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        mine = [d for d in self._held if d.request_id == request_id]
        self._held = [d for d in self._held if d.request_id != request_id]
        final = self._finish(req, "abort")
        if self._ahead is not None and not self._ahead.live():
            self.drain()                   # a step launched for ended requests only: read now, not after idling
        return _merged(mine + [final]) if mine else final

    def has_unfinished(self) -> bool:
        return bool(self._requests) or bool(self._held)

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """One scheduler step; returns the new output of every request that advanced or ended.

        Decode steps overlap the host's work with the GPU's: while every running request decodes on a
        model whose experts need no host work, a step is launched before the last one's tokens are
        read back, its input tokens taken from that step's draws on the device, and this call returns
        the last step's output while the new one computes. A request the last step ended (a stop
        string, an end-of-sequence token) leaves the new step's token for it unread. Anything else
        (a request to admit, a guide, a limit reached) reads the last step back first."""
        self._require_open()
        if self._ahead is not None and any(r.abort_requested for r in self._requests.values()):
            self.drain()            # its tokens first, as the steps before the abort gave them one at a time
        deltas, self._held = self._held, []
        deltas += [self._finish(r, "abort") for r in list(self._requests.values()) if r.abort_requested]
        ahead = self._ahead
        if ahead is not None:
            nxt = self._follow_ahead(ahead) if ahead.live() else None    # (raising, ahead stays to be read)
            self._ahead = None
            try:
                deltas += self._read_ahead(ahead)
            finally:
                # even when the read raised (its tokens are lost; the caller ends the requests), nxt is
                # the step in flight: read at the next step, its tokens unread if their requests ended
                self._ahead = nxt
            if nxt is not None and not nxt.live():
                self._ahead = None
                deltas += self._read_ahead(nxt)        # every request it ran for has ended: nothing follows it
            return [d for d in deltas if d is not None]
        sched = self.scheduler.schedule()
        if not sched.seqs:
            self.loaded.experts.settle()           # idle: the last replayed step's end, so its counts are in
            return deltas
        if not sched.preempted and self.runner.can_launch_ahead(sched):
            self._ahead = self._launch(sched, None)
            return [d for d in deltas if d is not None]
        t0 = time.perf_counter()
        try:
            sampled = self.runner.run(sched)
        except torch.OutOfMemoryError:
            self._out_of_memory(sched)
        now = time.perf_counter()
        for s in sched.seqs:
            s.request.num_computed += s.num_new
        deltas += self._take_tokens(sched.seqs, sampled, now)
        self.counters.on_step(sched, len(sampled.tokens), now - t0, now)
        self._last_read = now
        if not self._requests:
            self.loaded.experts.settle()           # out of work: the last replayed step's end, so its counts are in
        return [d for d in deltas if d is not None]

    def _out_of_memory(self, sched) -> None:
        if self.loaded.device.type == "cuda":
            torch.cuda.empty_cache()
        raise DeviceOutOfMemoryError(
            f"the GPU ran out of memory running a step of {sched.num_tokens} tokens; every request is kept — "
            "lower --max-batch-tokens, --prefill-chunk or --expert-pool-size, then continue") from None

    def _take_tokens(self, seqs, sampled, now: float) -> list[RequestDelta | None]:
        """Each sampling sequence's new token appended (rows in order), or its guide's failure."""
        deltas: list[RequestDelta | None] = []
        row = 0
        for s in seqs:
            if s.samples:
                if s.request.status is not Status.FINISHED:        # ended while its step ran ahead: unread
                    failed = sampled.failed.get(row)
                    if failed is not None:
                        deltas.append(self._finish(s.request, "error", error=failed))
                    else:
                        logprob = sampled.logprobs[row] if sampled.logprobs else None
                        deltas.append(self._append(s.request, sampled.tokens[row], now, logprob))
                row += 1
        return deltas

    # ---- decode steps launched ahead --------------------------------------------------------------
    def _launch(self, sched, ids: torch.Tensor | None) -> "_Ahead":
        """Launch ``sched`` (every sequence decoding one token) without reading it back; its tokens count
        as known (``in_flight``) so that the next step schedules past them."""
        t0 = time.perf_counter()
        try:
            queued = self.runner.launch(sched, ids)
        except torch.OutOfMemoryError:
            self._out_of_memory(sched)
        for s in sched.seqs:
            s.request.num_computed += 1
            s.request.in_flight += 1
        self.steps_ahead += 1
        return _Ahead(sched, queued, t0)

    def _follow_ahead(self, ahead: "_Ahead") -> "_Ahead | None":
        """The next decode step launched behind ``ahead`` (before reading it back), where nothing but
        ``ahead``'s tokens is needed to schedule it: the same requests still running in the same order,
        none waiting to be admitted, none that ``ahead``'s token takes to a limit, cache blocks for every
        next token without preempting anyone. None where it must wait for the read-back."""
        sch = self.scheduler
        running = sch.running
        if len(running) != len(ahead.requests) or any(a is not b for a, b in zip(running, ahead.requests)) \
                or not sch.decodes_all_without_change():
            return None
        for r in running:
            if r.abort_requested or len(r.output_ids) + r.in_flight >= r.params.max_tokens \
                    or r.num_tokens >= r.max_total_tokens:
                return None
        sched = sch.schedule()
        if sched.preempted or [s.request for s in sched.seqs] != ahead.requests \
                or not self.runner.can_launch_ahead(sched):
            raise RuntimeError("a decode step scheduled behind one launched ahead differs from it; "
                               "set overlap_steps=False and report this")
        return self._launch(sched, ahead.queued.on_device if ahead.queued is not None else None)

    def _read_ahead(self, ahead: "_Ahead") -> list[RequestDelta | None]:
        """``ahead``'s tokens read back (waiting for the step to end) and appended."""
        sampled = self.runner.take(ahead.queued)
        now = time.perf_counter()
        read = 0
        for r in ahead.requests:
            r.in_flight -= 1
            read += r.status is not Status.FINISHED          # the tokens of ended requests go unread
        deltas = self._take_tokens(ahead.sched.seqs, sampled, now)
        if read:                  # a step whose requests all ended gave no one anything: not a step of the stats
            # the step's time: from its launch, or from the last read-back where it ran behind another step
            self.counters.on_step(ahead.sched, read, now - max(ahead.launched, self._last_read), now)
        self._last_read = now
        if not self._requests:
            self.loaded.experts.settle()
        return deltas

    def drain(self) -> None:
        """Read back a decode step launched ahead, if any: before anything that changes the model, its
        settings or its recordings. What it added comes out of the next :meth:`step`."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self._held += [d for d in self._read_ahead(ahead) if d is not None]

    def _append(self, req: Request, token: int, now: float, logprob: TokenLogprob | None = None) -> RequestDelta | None:
        if req.first_token_at is None:
            req.first_token_at = now
            self.counters.on_first_token(req.ttft_ms)
        req.output_ids.append(token)
        if logprob is not None:
            req.logprobs.append(logprob)
        p = req.params
        # Under a guide the grammar decides where the output ends: it allows an end-of-sequence token
        # only once it is complete, and then that token ends the request even with ignore_eos.
        eos = (not p.ignore_eos or req.guide is not None) and token in self.eos_ids
        if eos or token in p.stop_token_ids:
            return self._finish(req, "stop", drop_last=True)
        guided = False
        if req.guide is not None:
            guided = req.guide_on()
            if not guided:                                # reasoning the prompt opened: the model's own
                req.guide_gate.in_answer(token)
            failed = req.guide.consume(token) if guided else None
            if failed is not None:
                return self._finish(req, "error", error=failed)
        prev = len(req.text)
        req.text += req.detokenizer.push([token]) if req.detokenizer else ""
        # stop strings end free text: what a guide holds (JSON, a forced call) ends where its grammar does
        held = guided and not p.guide.stoppable
        cut = self._stop_at(req, token, prev) if p.stop and not held else None
        if cut is not None:
            stop_len = next((len(s) for s in p.stop if req.text.startswith(s, cut)), 0)
            req.text = req.text[:cut + (stop_len if p.include_stop_str_in_output else 0)]
            req.stop_string = True
            return self._finish(req, "stop")
        if req.guide is not None and req.guide.done:
            req.text += req.detokenizer.flush() if req.detokenizer else ""
            return self._finish(req, "stop")
        if len(req.output_ids) >= p.max_tokens or req.num_tokens - req.in_flight >= req.max_total_tokens:
            req.text += req.detokenizer.flush() if req.detokenizer else ""
            return self._finish(req, "length")
        return self._emit(req, final=False)

    @staticmethod
    def _stop_at(req: Request, token: int, prev: int) -> int | None:
        """Where the earliest stop string the newest text completes begins in ``req.text`` (``prev``: its
        length before this token). With a stop scope, stops are matched in the answer's text alone (the
        tokens its gate calls the answer's, each segment's lead shed, as the reply's reader shows it), and
        the cut falls where the stop begins in ``text`` when that is within the answer's latest run."""
        stop, piece = req.params.stop, req.text[prev:]
        if req.stop_gate is None:
            return _earliest_stop(req.text, prev, stop)
        if not req.stop_gate.in_answer(token):
            if piece:
                req.answer_tail = 0
            req.answer_lead = True
            return None
        if req.answer_lead:
            lead = req.params.stop_scope.lead
            piece = piece.lstrip(lead) if lead else piece
            req.answer_lead = not piece
        before = len(req.answer)
        req.answer += piece
        req.answer_tail += len(piece)
        cut = _earliest_stop(req.answer, before, stop)
        if cut is None:
            return None
        back = len(req.answer) - cut                    # the answer's characters from the stop on
        return len(req.text) - back if back <= req.answer_tail else prev

    def _emit(self, req: Request, final: bool, reason: str | None = None) -> RequestDelta | None:
        if final or not req.params.stop:
            hold = 0
        elif req.stop_gate is None:
            hold = stop_holdback(req.text, req.params.stop)
        else:
            hold = min(stop_holdback(req.answer, req.params.stop), req.answer_tail)
        upto = max(req.sent_chars, len(req.text) - hold)
        new_text, new_ids = req.text[req.sent_chars:upto], tuple(req.output_ids[req.sent_tokens:])
        if not final and not new_text and not new_ids:
            return None
        ttft = req.ttft_ms if req.sent_tokens == 0 and new_ids else None
        # logprobs follow token_ids one for one (a stop token dropped from the text keeps its logprob)
        logprobs = tuple(req.logprobs[req.sent_tokens:]) if req.params.logprobs is not None else ()
        req.sent_chars, req.sent_tokens = upto, len(req.output_ids)
        return RequestDelta(req.request_id, new_ids, new_text, final, reason, len(req.prompt_ids),
                            len(req.output_ids), ttft, req.error if final else None, logprobs,
                            final and req.stop_string)

    def _finish(self, req: Request, reason: str, drop_last: bool = False, error: str | None = None) -> RequestDelta:
        if drop_last and req.detokenizer:   # the stop token is reported in token_ids but never as text
            req.text += req.detokenizer.flush()
        req.error = error
        req.status, req.finish_reason, req.finished_at = Status.FINISHED, reason, time.perf_counter()
        self.scheduler.remove(req)
        self._requests.pop(req.request_id, None)
        self.counters.on_finish()
        return self._emit(req, final=True, reason=reason)

    # ---- scoring, stats, live changes -------------------------------------------------------------
    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [T, vocab] (float32, on the CPU) of every position of ``token_ids``."""
        return self.score_batch([token_ids])[0]

    def score_batch(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """Logits of several sequences of different lengths, computed in one batch."""
        self._require_open()
        self.drain()
        checked = [self._prompt_ids(ids) for ids in seqs]
        for ids in checked:
            self._check_prompt(ids, scoring=True)
        return self.loaded.score(checked)

    def stats(self) -> EngineStats:
        """The counters now; once closed, as they were when the engine closed."""
        return self._closed if self._closed is not None else stats_mod.snapshot(self)

    def reconfigure(self, **options) -> dict[str, str]:
        """Apply live options between steps; raises ReconfigureError and applies nothing if one is rejected."""
        self._require_open()
        self.drain()
        return self.live.reconfigure(options)

    def live_options(self) -> dict[str, str | None]:
        self._require_open()
        return self.live.availability()

    def _require_open(self) -> None:
        if self._closed is not None:
            raise ConfigError(f"{self.model_info.name} was closed, which gave its memory back; load the model again "
                              "to run it")

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def close(self) -> None:
        """End the model's work (a routing profile written, copies in flight waited for) and give its
        memory back now: the engine keeps its counters, not its weights, KV cache, expert pool or CUDA
        graphs, so the next model finds the card's memory free when this returns, not whenever Python's
        collector next runs (the model's objects refer to each other). Closing again does nothing."""
        if self._closed is not None:
            return
        try:
            self.drain()                              # the step launched ahead ends before the memory goes
        except Exception:  # noqa: BLE001 - closing must go on
            self._ahead = None
        self._closed = self._final_stats()
        device = self.loaded.device
        try:
            for r in list(self._requests.values()):   # what was still running ends as aborted
                self._finish(r, "abort")
        except Exception:  # noqa: BLE001 - a request's end must not keep the memory
            self._requests.clear()
        try:
            self.loaded.close()
        finally:
            self.runner = self.scheduler = self.live = None
            self.loaded.release()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    def _final_stats(self) -> EngineStats:
        """The counters as the engine closes: the deferred end of the last replayed step settled and the
        device's counts read after the device is done; where a part of the engine is gone already (a
        pipeline stage that stopped), the counters of this process alone."""
        try:
            self.loaded.experts.settle()
            self.stats()                  # starts the copy of the device-side counts ...
            if self.loaded.device.type == "cuda":
                torch.cuda.synchronize(self.loaded.device)
            return self.stats()           # ... which this one reads
        except Exception:  # noqa: BLE001 - closing must go on
            return EngineStats(timestamp=time.time(), prompt_tokens=self.counters.prompt_tokens,
                               generated_tokens=self.counters.generated_tokens)

    def __enter__(self) -> "LLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
