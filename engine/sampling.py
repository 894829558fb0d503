"""Sampling parameters and the batched sampler."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request. ``temperature=0`` means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1.0 = off
    min_p: float = 0.0              # 0.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off; applied to prompt and generated tokens (HF semantics)
    seed: int | None = None
    stop: tuple[str, ...] = ()      # stop strings; not included in the output text
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False        # keep going past the model's end-of-sequence tokens
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1 (got {self.max_tokens})")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (got {self.top_k}); 0 turns it off")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1] (got {self.top_p})")
        if not 0.0 <= self.min_p < 1.0:
            raise ConfigError(f"min_p must be in [0, 1) (got {self.min_p})")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"repetition_penalty must be > 0 (got {self.repetition_penalty})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
