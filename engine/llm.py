"""``LLM``: the offline Python API (DESIGN.md §9) over ``LLMEngine``.

A call to :meth:`LLM.generate` runs or is refused as a whole: every prompt is checked before any is
queued, and whatever stops a running call (an exception from a step, Ctrl-C) first ends the requests
that call added, so the object is always ready for the next call.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ConfigError, StrataError
from engine.outputs import RequestDelta, RequestOutput
from engine.sampling import SamplingParams
from engine.telemetry import EngineStats

Prompt = str | Sequence[int]


@dataclass
class _Collected:
    """What one request of a ``generate`` call has produced so far."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    ttft_ms: float | None = None
    reason: str | None = None
    logprobs: list = field(default_factory=list)
    error: str | None = None

    def add(self, d: RequestDelta) -> None:
        self.ids += d.new_token_ids
        self.text.append(d.new_text)
        self.logprobs += d.logprobs
        self.error = d.error or self.error
        self.ttft_ms = self.ttft_ms if d.ttft_ms is None else d.ttft_ms
        if d.finished:
            self.reason = d.finish_reason


class LLM:
    """``LLM(model_dir, device=..., dtype=..., expert_pool_size="10G", ...)``."""

    def __init__(self, model: str, **options) -> None:
        _check_options(options)
        self.engine = LLMEngine(EngineConfig(model=str(model), **options))
        self.tokenizer = self.engine.tokenizer

    @property
    def context_tokens(self) -> int:
        """The context as loaded: a prompt and its reply together never exceed it."""
        return self.engine.context_tokens

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion (batched); outputs in prompt order.

        ``params`` is one SamplingParams for every prompt, or a list with one per prompt. A prompt or
        a setting that cannot run raises a ConfigError naming it, and nothing of the call runs.
        """
        prompts = _as_prompt_list(prompts)
        per_prompt = _params_per_prompt(params, len(prompts))
        checked = [self._validate(i, len(prompts), p, sp) for i, (p, sp) in enumerate(zip(prompts, per_prompt))]
        runs: dict[str, _Collected] = {}
        try:
            for ids, sp in zip(checked, per_prompt):
                runs[self.engine.add_request(None, ids, sp)] = _Collected(ids)
            self._run(runs)
        except BaseException:
            # Leave nothing of this call in the engine, whatever stopped it (a step's error, Ctrl-C).
            for rid in runs:
                self.engine.abort_now(rid)
            raise
        return [RequestOutput(rid, r.prompt_ids, r.ids, "".join(r.text), r.reason, r.ttft_ms,
                              logprobs=tuple(r.logprobs), error=r.error)
                for rid, r in runs.items()]

    def _validate(self, i: int, n: int, prompt: Prompt, params: SamplingParams) -> list[int]:
        try:
            return self.engine.validate_request(prompt, params)
        except StrataError as e:
            if n == 1:
                raise
            raise type(e)(f"prompt {i + 1} of {n}: {e}") from None

    def _run(self, runs: dict[str, _Collected]) -> None:
        pending = set(runs)
        while pending:
            for d in self.engine.step():
                run = runs.get(d.request_id)      # a request added to self.engine by hand is not ours
                if run is None:
                    continue
                run.add(d)
                if d.finished:
                    pending.discard(d.request_id)

    def score(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits [T, vocab] for every position of ``token_ids``."""
        return self.engine.score(list(token_ids))

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def reconfigure(self, **options) -> dict[str, str]:
        return self.engine.reconfigure(**options)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_options(options: dict) -> None:
    """An option EngineConfig does not have is one line naming it and the nearest one it has."""
    known = {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "extra"}
    for name in options:
        if name not in known:
            near = sorted((k for k in known if k.startswith(name)), key=len)[:1] \
                or difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)    # a name cut short first
            hint = f"did you mean {near[0]}?" if near else "see EngineConfig for the options (docs/cli.md lists them as flags)"
            raise ConfigError(f"LLM has no option {name!r}; {hint}")


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text or token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()          # [T] ids or [N, T] rows of ids
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Sequence):
        raise ConfigError(f"prompts must be text, a list of token ids, or a list of those "
                          f"(got {type(prompts).__name__})")
    items = list(prompts)
    if items and not isinstance(items[0], (str, Sequence)):
        return [items]          # one prompt of token ids
    return items


def _params_per_prompt(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if not isinstance(params, Sequence) or isinstance(params, str):
        raise ConfigError(f"params must be a SamplingParams or a list of them (got {type(params).__name__})")
    if len(params) != n:
        raise ConfigError(f"got {len(params)} SamplingParams for {n} prompts; pass one for every prompt, "
                          "or a single one for all")
    return list(params)
