"""The frozen dataclasses that travel between the engine thread and the GUI.

Commands go into the bridge's queue; events come out as Qt signals. None of them holds a reference
to the engine, a tensor or a widget, so they are safe to hand across threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: What a chat does when it outgrows the context: the engine's policy names (``engine.context``), copied
#: here because widgets reach the engine only through the bridge (a test keeps the two the same).
CONTEXT_OVERFLOW_POLICIES = ("drop-oldest", "stop")
#: How hard a reasoning model (harmony: gpt-oss) thinks: ``engine.chat_format.harmony.EFFORTS``, copied likewise.
REASONING_EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling settings the chat pane exposes."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    max_tokens: int = 512
    context_overflow: str = "drop-oldest"   # one of CONTEXT_OVERFLOW_POLICIES
    reasoning_effort: str = "medium"        # one of REASONING_EFFORTS (reasoning models only)


@dataclass(frozen=True)
class ChatMessage:
    role: str       # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class ReplyRequest:
    """One generation: a chat (``messages``), a plain completion (``prompt``) or a synthetic load."""

    request_id: str
    settings: GenerationSettings
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None              # completion mode: continue this text
    synthetic_prompt_tokens: int = 0       # load test: a prompt of exactly this many tokens
    ignore_eos: bool = False
    tag: str = "chat"                      # "chat" | "loadtest"


@dataclass(frozen=True)
class TextChunk:
    request_id: str
    text: str
    reasoning: str = ""       # a reasoning model's thinking (shown apart from the answer)
    used_tokens: int = 0      # the context its request takes so far: prompt and reply tokens (0: not known)


@dataclass(frozen=True)
class TextBatch:
    """Coalesced text of one or more requests since the previous batch (at most ~30 per second)."""

    chunks: tuple[TextChunk, ...]


@dataclass(frozen=True)
class ReplyStats:
    """What one reply cost, kept under it in the chat."""

    request_id: str
    tag: str
    finish_reason: str                 # "stop" | "length" | "abort" | "error" | "closed" (the model was closed)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    prompt_tok_s: float | None = None
    decode_tok_s: float | None = None
    expert_hit_rate: float | None = None
    started: float = 0.0               # perf_counter seconds
    finished: float = 0.0
    error: str | None = None

    def summary(self, max_tokens: int | None = None) -> str:
        """One line for under the reply: TTFT, speeds, tokens, why it ended, expert hits.

        ``max_tokens`` (the request's limit) tells "reached max tokens" from "context full".
        """
        if self.completion_tokens == 0 and self.finish_reason != "closed" and \
                (self.finish_reason == "error" or self.error):
            return self.finish_words(max_tokens)            # refused or failed before a token: only why
        parts = [f"TTFT {self.ttft_ms:.0f} ms" if self.ttft_ms is not None else "TTFT —"]
        if self.prompt_tok_s is not None:
            parts.append(f"prompt {self.prompt_tok_s:.1f} tok/s")
        parts.append(f"decode {self.decode_tok_s:.1f} tok/s" if self.decode_tok_s is not None else "decode —")
        parts.append(f"{self.completion_tokens} tokens")
        parts.append(self.finish_words(max_tokens))
        if self.expert_hit_rate is not None:
            parts.append(f"expert hits {self.expert_hit_rate * 100:.1f}%")
        return " · ".join(parts)

    def finish_words(self, max_tokens: int | None = None) -> str:
        """Why the reply ended, as a user says it."""
        if self.finish_reason == "closed":     # not a failure: the model it ran on was changed or closed
            return f"stopped: {self.error or 'the model was closed'}"
        if self.finish_reason == "error" or self.error:
            return f"error: {self.error or 'the reply failed'}"
        if self.finish_reason == "length" and max_tokens is not None and self.completion_tokens < max_tokens:
            return "context full"      # the engine ends a reply that reaches the end of the context as "length"
        return _FINISH_WORDS.get(self.finish_reason, self.finish_reason)


_FINISH_WORDS = {"stop": "finished", "length": "reached max tokens", "abort": "stopped by you"}


@dataclass(frozen=True)
class ContextUsage:
    """How much of the model's context a chat request takes, and what was dropped to fit it."""

    request_id: str
    prompt_tokens: int
    context_tokens: int
    reply_tokens: int              # kept free for the reply
    dropped_messages: int = 0
    note: str = ""                 # one line for the transcript when something was dropped (messages or tokens)


@dataclass(frozen=True)
class ModelDescription:
    """The loaded model, as the window shows it."""

    name: str
    path: str
    family: str
    device: str
    num_layers: int
    num_experts: int
    top_k: int
    params: int
    is_demo: bool
    random_weights: bool
    has_chat_template: bool
    notes: tuple[str, ...] = ()    # settings the engine clamped or ignored at load (one line each)
    context_tokens: int = 0        # the model's context as loaded (max_model_len)
    reasons: bool = False          # it writes its reasoning apart (harmony) and takes a reasoning effort
    completion_only: bool = False  # a base model: whatever chat template it ships was not what it learnt
    template_broken: bool = False  # its chat template does not parse (a load note says where)


@dataclass(frozen=True)
class KnobState:
    """Current value of every live option, why some cannot change now, and the pool-size bounds."""

    values: tuple[tuple[str, object], ...]
    unsupported: tuple[tuple[str, str], ...]      # option -> reason it cannot change now
    defaults: tuple[tuple[str, object], ...]      # the values at load, for "Reset to defaults"
    pool_max_bytes: int = 0                       # slider upper bound (budget, or all experts on CPU)
    pool_bytes: int = 0                           # what the pool holds now
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()   # option -> allowed values (combo boxes)
    automatic: tuple[tuple[str, int], ...] = ()   # option -> what its automatic value (None) comes to now
    most: tuple[tuple[str, int], ...] = ()        # option -> the largest value this load takes (number boxes)
    expert_bytes: int = 0                         # one routed expert's bytes: a smaller pool holds none

    def value(self, name: str) -> object:
        return dict(self.values).get(name)

    def most_of(self, name: str) -> int | None:
        return dict(self.most).get(name)

    def automatic_value(self, name: str) -> int | None:
        return dict(self.automatic).get(name)

    def reason(self, name: str) -> str | None:
        return dict(self.unsupported).get(name)

    def choices_of(self, name: str) -> tuple[str, ...]:
        return dict(self.choices).get(name, ())


@dataclass(frozen=True)
class KnobResult:
    """The engine's answer to one live change."""

    option: str
    value: object
    applied: bool
    message: str


@dataclass(frozen=True)
class BridgeError:
    """Something went wrong in the engine thread; ``message`` is one line for a banner."""

    message: str
    source: str = "engine"      # "load" | "engine" | "reconfigure" | "internal"


@dataclass(frozen=True)
class PauseState:
    paused: bool
    reason: str = ""


@dataclass(frozen=True)
class SessionRow:
    """One recorded sample: flat name -> value pairs for the CSV."""

    values: tuple[tuple[str, object], ...] = field(default=())
