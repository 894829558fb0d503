"""A request's mutable state inside the engine (owned by the engine thread only)."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from engine.guided import GuideMatcher
from engine.outputs import TokenLogprob
from engine.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_total_tokens: int                         # prompt + output may not exceed this (max_model_len)
    generator: torch.Generator | None = None
    detokenizer: object | None = None             # IncrementalDetokenizer
    output_ids: list[int] = field(default_factory=list)
    guide: GuideMatcher | None = None             # where the output stands in its grammar (params.guide)
    logprobs: list[TokenLogprob] = field(default_factory=list)   # one per output id, when params.logprobs is set
    status: Status = Status.WAITING
    num_computed: int = 0                         # tokens whose K/V are in the cache
    # tokens sampled by a step launched ahead whose result the host has not read yet (0 or 1): they
    # count among the known tokens, so the next step schedules past them (engine/engine.py)
    in_flight: int = 0
    blocks: list[int] = field(default_factory=list)            # KV block table of the full-attention layers
    window_blocks: list[int] = field(default_factory=list)     # of the window layers, when the cache has them
    text: str = ""                                # detokenised output so far (stop strings cut)
    sent_chars: int = 0                           # characters of ``text`` already streamed
    sent_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None                      # one line, when finish_reason == "error"
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    abort_requested: bool = False
    stop_string: bool = False                     # one of its stop strings ended it
    stop_gate: object | None = None               # params.stop_scope's AnswerGate (None: stops apply to ``text``)
    guide_gate: object | None = None              # another of its gates: the guide waits for the answer
    answer: str = ""                              # with a gate: the answer's text, where stops apply
    answer_tail: int = 0                          # how many of ``text``'s last characters are the answer's
    answer_lead: bool = True                      # the next answer text starts a segment (its lead is shed)

    def guide_on(self) -> bool:
        """Whether the next token follows the guide: always, unless a reasoning format's gate holds the
        guide until the answer starts (a template that opened a ``<think>`` block for the reply); from
        there on the guide holds to the end."""
        if self.guide_gate is not None and self.guide_gate.next_in_answer():
            self.guide_gate = None
        return self.guide is not None and self.guide_gate is None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, i: int) -> int:
        """Token ``i`` of prompt + output, without building their concatenation."""
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) + self.in_flight

    @property
    def remaining(self) -> int:
        """Tokens known but not yet in the cache (prompt chunks, or the last sampled token)."""
        return self.num_tokens - self.num_computed

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.arrival) * 1e3

    @property
    def decode_tok_s(self) -> float | None:
        if self.first_token_at is None or self.finished_at is None or len(self.output_ids) < 2:
            return None
        return (len(self.output_ids) - 1) / max(self.finished_at - self.first_token_at, 1e-9)
