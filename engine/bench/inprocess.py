"""A workload run against an engine in this process, through the ``EngineLoop`` and ``Job``s the HTTP
server uses, so the two are measured on the same path up to the wire."""
from __future__ import annotations

import asyncio
import secrets
import time

from engine.bench.driver import NoProgress, Progress, drive
from engine.bench.engine_side import (EngineFacts, EngineProbe, Limits, engine_facts, engine_figures,
                                      measure_limits)
from engine.bench.metrics import RequestRecord, summarise
from engine.bench.result import BenchRun
from engine.bench.workload import BenchRequest, Workload, request_seed
from engine.errors import ConfigError, StrataError
from engine.loop import EngineLoop, Job
from engine.sampling import SamplingParams


def check_workload(workload: Workload, facts: EngineFacts) -> None:
    """Refuse a workload the model cannot run as asked, before anything is sent."""
    if workload.text_prompts and not facts.has_tokenizer:
        raise ConfigError(f"{facts.model} has no tokenizer, so it cannot take --text-prompts; leave the flag out "
                          "to send token ids")
    if workload.longest > facts.context_tokens:
        more = (f", or raise --max-model-len (the model allows {facts.model_max_tokens})"
                if facts.model_max_tokens > facts.context_tokens else "")
        raise ConfigError(f"the workload's longest request needs {workload.longest} tokens (prompt up to "
                          f"{workload.prompt_len.largest}, output up to {workload.output_len.largest}) but the "
                          f"context holds {facts.context_tokens}; lower --prompt-len or --output-len{more}")


def run_in_process(loop: EngineLoop, workload: Workload, progress: Progress | None = None,
                   limits: Limits | None = None) -> BenchRun:
    """Run ``workload`` on the engine ``loop`` drives (its thread must be running). ``limits``: the
    bandwidths to set the run against (measured now when not given)."""
    facts = loop.call(engine_facts).result()
    check_workload(workload, facts)
    requests = workload.requests(facts.vocab_size, facts.special_ids)
    if limits is None:
        limits = loop.call(lambda e: measure_limits(e.loaded.device)).result()
    run_id = secrets.token_hex(4)
    probe = EngineProbe(loop)
    probe.start()
    try:
        progress = progress or NoProgress()
        records, wall = asyncio.run(drive(workload, requests, lambda r: _send(loop, r, workload, run_id, progress),
                                          progress))
    finally:
        step_ms, before, after = probe.stop()
    summary = summarise(records, wall)
    return BenchRun("in-process", facts.model, workload, summary, tuple(records),
                    engine_figures(step_ms, before, after, facts, limits, summary), facts.device, facts.config)


async def _send(loop: EngineLoop, req: BenchRequest, workload: Workload, run_id: str,
                progress: Progress) -> RequestRecord:
    aloop = asyncio.get_running_loop()
    deltas: asyncio.Queue = asyncio.Queue()

    def sink(delta) -> None:                 # on the loop thread: stamp it now, hand it over, return
        try:
            aloop.call_soon_threadsafe(deltas.put_nowait, (time.perf_counter(), delta))
        except RuntimeError:                 # the run was interrupted and its event loop closed: nobody listens
            pass

    rid = f"bench-{run_id}-{req.index}"
    params = SamplingParams(max_tokens=req.output_len, temperature=workload.temperature,
                            ignore_eos=workload.ignore_eos, seed=request_seed(workload, req))
    record = RequestRecord(req.index, time.perf_counter())
    try:
        await asyncio.wrap_future(loop.submit(Job(rid, req.prompt, params, sink)))
    except StrataError as e:
        record.error, record.finished_at = str(e), time.perf_counter()
        return record
    try:
        while True:
            t, d = await deltas.get()
            if d.new_token_ids:
                record.arrivals.append((t, len(d.new_token_ids)))
                progress.tokens(len(d.new_token_ids))
            if d.finished:
                record.prompt_tokens, record.output_tokens = d.prompt_tokens, d.completion_tokens
                record.finished_at, record.finish_reason = t, d.finish_reason
                if d.finish_reason == "error":
                    record.error = d.error or "the engine ended the request with an error"
                return record
    except asyncio.CancelledError:           # the run was interrupted: end the request in the engine too
        loop.cancel(rid)
        raise
