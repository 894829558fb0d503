"""What to do when a conversation outgrows the model's context: one policy for every front end.

The engine, the workbench and the CLI chat fit a conversation into the context through
:func:`fit_messages` (chat) or :func:`fit_text` (completion), so each says the same thing when a
conversation is too long (the HTTP server follows the OpenAI rule instead, prompt plus ``max_tokens``
within the context: engine/server/protocol.py):

* ``"stop"``: refuse the turn with a :class:`ContextOverflowError` that names the sizes and the fix;
* ``"drop-oldest"``: drop the oldest turns (never the system prompt, never the newest user message)
  until the prompt and room for the reply fit, and say how many were dropped.

Room for the reply is ``min(max_tokens, context_tokens // 4)`` (at least one token): a reply is
guaranteed that many tokens, and a ``max_tokens`` near the context size does not push the whole
history out. A reply that needs more keeps going until prompt + reply reach the context, where the
engine ends it with finish reason ``"length"``.

Both functions are pure: they read the tokenizer and return a new :class:`FittedPrompt`; the caller's
messages and text are never changed, so a front end keeps the whole transcript and only the model sees
the fitted part.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import ConfigError, StrataError

OVERFLOW_POLICIES = ("drop-oldest", "stop")
DEFAULT_OVERFLOW = "drop-oldest"
REPLY_SHARE = 4          # the reply's room is at most 1/REPLY_SHARE of the context


# the advice of a refusal under the stop policy, in words each front end replaces with its own control
DROP_OLDEST_FIX = "switch the context-overflow policy to drop-oldest"


class ContextOverflowError(StrataError):
    """The conversation does not fit the context and the policy is ``stop`` (or nothing can be dropped).

    ``droppable``: the drop-oldest policy would have made it fit, so a front end may offer to switch.
    """

    def __init__(self, message: str, droppable: bool = False) -> None:
        super().__init__(message)
        self.droppable = droppable


class PromptTokenizer(Protocol):
    """What fitting needs of a tokenizer (``engine.tokenizer.Tokenizer`` is one)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs: Any) -> str | list[int]: ...


@dataclass(frozen=True)
class FittedPrompt:
    """A prompt that fits the context, and what fitting it cost.

    For a chat, the dropped messages are the ``dropped_messages`` messages right after the leading
    system messages. For a completion prompt, the first ``dropped_tokens`` tokens of its text were
    cut (special tokens the tokenizer adds at the start, such as a BOS, are kept).
    """

    token_ids: list[int]
    prompt_tokens: int          # len(token_ids)
    context_tokens: int         # the model's context (max_model_len)
    reply_tokens: int           # tokens kept free for the reply
    dropped_messages: int = 0   # chat: messages dropped from the front (after the system prompt)
    policy: str = DEFAULT_OVERFLOW
    dropped_tokens: int = 0     # completion: tokens cut from the start of the text

    @property
    def note(self) -> str:
        """One line for the UI when something was dropped, else ''."""
        where = f"to fit the {self.context_tokens}-token context"
        if self.dropped_messages == 1:
            return f"dropped the oldest message {where}"
        if self.dropped_messages > 1:
            return f"dropped the {self.dropped_messages} oldest messages {where}"
        if self.dropped_tokens > 0:
            return f"dropped the first {self.dropped_tokens} tokens of the prompt {where}"
        return ""


def reply_room(context_tokens: int, max_tokens: int) -> int:
    """Tokens kept free for the reply: ``max_tokens``, but at most a quarter of the context."""
    return max(1, min(max_tokens, context_tokens // REPLY_SHARE))


def fit_messages(tokenizer: PromptTokenizer, messages: Sequence[dict], context_tokens: int, max_tokens: int,
                 policy: str = DEFAULT_OVERFLOW) -> FittedPrompt:
    """Render ``messages`` with the chat template (generation prompt added) so that it fits.

    ``drop-oldest`` drops whole turns (a user message and the replies after it) from the front; the
    leading system messages and the turn of the newest user message always stay.
    """
    reply = _checked_reply_room(context_tokens, max_tokens, policy)
    messages = _checked_messages(messages)
    ids = _render(tokenizer, messages)
    if len(ids) + reply <= context_tokens:
        return FittedPrompt(ids, len(ids), context_tokens, reply, policy=policy)
    head, turns = _split_turns(messages)
    budget = context_tokens - reply
    newest = _render(tokenizer, head + turns[-1]) if len(turns) > 1 else ids
    if len(newest) > budget:          # nothing may be dropped that would make it fit
        raise _newest_too_long(len(newest), reply, context_tokens, has_system=bool(head),
                               capped=_capped(reply, max_tokens))
    if policy == "stop":
        raise ContextOverflowError(
            f"the conversation needs {len(ids)} tokens plus {reply} for the reply, but the context holds "
            f"{context_tokens}{_capped(reply, max_tokens)}; start a new chat, shorten the conversation, or switch the "
            "context-overflow policy to drop-oldest", droppable=True)
    # Fewest turns dropped such that the rest fits: the prompt shrinks as more turns go, so bisect
    # (hi always fits and best is its rendering; dropping none is known not to fit).
    lo, hi, best = 1, len(turns) - 1, newest
    while lo < hi:
        mid = (lo + hi) // 2
        ids = _render(tokenizer, head + _flatten(turns[mid:]))
        if len(ids) <= budget:
            hi, best = mid, ids
        else:
            lo = mid + 1
    dropped = sum(len(t) for t in turns[:hi])
    return FittedPrompt(best, len(best), context_tokens, reply, dropped_messages=dropped, policy=policy)


def fit_text(tokenizer: PromptTokenizer, text: str, context_tokens: int, max_tokens: int,
             policy: str = DEFAULT_OVERFLOW, newest: str | None = None) -> FittedPrompt:
    """Encode a completion prompt so that it fits (``drop-oldest`` keeps its end).

    The text is cut at a token boundary: the first ``dropped_tokens`` tokens of its encoding go, and
    the special tokens the tokenizer adds around it (a BOS, say) stay. ``newest``: the end of ``text``
    that must stay whole (a chat's newest message, in completion mode): when it alone does not fit,
    the turn is refused under either policy, as :func:`fit_messages` refuses a newest message.
    """
    reply = _checked_reply_room(context_tokens, max_tokens, policy)
    ids = list(tokenizer.encode(text))
    if len(ids) + reply <= context_tokens:
        return FittedPrompt(ids, len(ids), context_tokens, reply, policy=policy)
    if newest:
        needed = len(tokenizer.encode(newest))
        if needed + reply > context_tokens:          # nothing may be dropped that would make it fit
            raise _newest_too_long(needed, reply, context_tokens, has_system=False)
    if policy == "stop":
        raise ContextOverflowError(
            f"the prompt needs {len(ids)} tokens plus {reply} for the reply, but the context holds "
            f"{context_tokens}; shorten the prompt or {DROP_OLDEST_FIX}",
            droppable=True)
    pre, body, post = _split_added_tokens(tokenizer, text, ids)
    keep = context_tokens - reply - len(pre) - len(post)
    if keep < 1:
        raise ContextOverflowError(
            f"the tokens the tokenizer adds to every prompt ({len(pre) + len(post)}) plus {reply} for the reply "
            f"fill the {context_tokens}-token context; lower max tokens or load the model with a longer context")
    kept = pre + body[-keep:] + post
    return FittedPrompt(kept, len(kept), context_tokens, reply, policy=policy, dropped_tokens=len(body) - keep)


def _checked_reply_room(context_tokens: int, max_tokens: int, policy: str) -> int:
    if policy not in OVERFLOW_POLICIES:
        raise ConfigError(f"context-overflow policy must be one of {', '.join(OVERFLOW_POLICIES)} (got {policy!r})")
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 2:
        raise ConfigError(f"the context must hold at least 2 tokens (got {context_tokens!r})")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a whole number >= 1 (got {max_tokens!r})")
    return reply_room(context_tokens, max_tokens)


def _checked_messages(messages: Sequence[dict]) -> list[dict]:
    messages = list(messages)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ConfigError(f"message {i + 1} of the conversation is not a mapping with a 'role' "
                              f"(got {m!r:.60}); give each message as {{'role': ..., 'content': ...}}")
    return messages


def _render(tokenizer: PromptTokenizer, messages: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def _split_turns(messages: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """(leading system messages, turns); a turn starts at a user message, the last turn is the newest."""
    n_head = 0
    while n_head < len(messages) and messages[n_head].get("role") == "system":
        n_head += 1
    turns: list[list[dict]] = []
    for m in messages[n_head:]:
        if not turns or m.get("role") == "user":
            turns.append([])
        turns[-1].append(m)
    return messages[:n_head], turns or [[]]


def _flatten(turns: list[list[dict]]) -> list[dict]:
    return [m for t in turns for m in t]


def _newest_too_long(needed: int, reply: int, context_tokens: int, has_system: bool,
                     capped: str = "") -> ContextOverflowError:
    what = "the system prompt and the newest message need" if has_system else "the newest message needs"
    fix = "send a shorter message" + (" or shorten the system prompt" if has_system else "")
    return ContextOverflowError(
        f"{what} {needed} tokens plus {reply} for the reply, but the context holds {context_tokens}{capped}; {fix}")


def _capped(reply: int, max_tokens: int) -> str:
    """Why the room kept for the reply is less than max tokens, where it is."""
    if reply >= max_tokens:
        return ""
    return f" (a chat keeps at most a quarter of it for the reply, so {reply} of the {max_tokens} max tokens)"


def _split_added_tokens(tokenizer: PromptTokenizer, text: str,
                        ids: list[int]) -> tuple[list[int], list[int], list[int]]:
    """(tokens added before the text, the text's own tokens, tokens added after it)."""
    plain = list(tokenizer.encode(text, add_special_tokens=False))
    for start in range(len(ids) - len(plain) + 1):
        if ids[start:start + len(plain)] == plain:
            return ids[:start], plain, ids[start + len(plain):]
    return [], ids, []        # a tokenizer whose added tokens change the text's own tokens: cut the whole
