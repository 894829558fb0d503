"""``generate`` and ``chat``: text in, streamed text out."""
from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass, field, fields

from engine.cli.options import engine_options, model_dir, utf8_text
from engine.config import EngineConfig
from engine.context import DROP_OLDEST_FIX, OVERFLOW_POLICIES, ContextOverflowError, fit_text
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import StrataError
from engine.outputs import RequestDelta
from engine.sampling import SamplingParams

# What each command does when the prompt and the reply's room outgrow the context (engine.context).
GENERATE_OVERFLOW = "stop"
CHAT_OVERFLOW = "drop-oldest"


def add_sampling_flags(p: argparse.ArgumentParser, temperature: float) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default: 128)")
    g.add_argument("--temperature", type=float, default=temperature, help=f"0 = greedy (default: {temperature:g})")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1, off)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (default: 0, off)")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below this share of the likeliest one's probability (default: 0, off)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="above 1 discourages repeats (default: 1)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    g.add_argument("--stop", action="append", default=[], type=utf8_text, help="stop string (repeatable)")
    g.add_argument("--context-overflow", choices=OVERFLOW_POLICIES, default=None,
                   help="when the prompt and the reply outgrow the context: drop the oldest turns (or text), "
                        f"or stop with an error (default: {CHAT_OVERFLOW} in chat, {GENERATE_OVERFLOW} in generate)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          seed=args.seed, stop=tuple(args.stop))


def open_engine(args: argparse.Namespace):
    from engine.cli.convert import ProgressBar
    from engine.collector import freeze_imports
    from engine.engine import LLMEngine
    freeze_imports()                   # before the model: later collections walk only what comes after
    progress = ProgressBar("verifying checksums", in_bytes=True)
    try:
        engine = LLMEngine(EngineConfig(model=model_dir(args), **engine_options(args)), progress=progress)
    finally:
        progress.clear()
    info = engine.model_info
    if info.random_weights:
        print(f"note: {info.name} is a demo model with RANDOM weights — its output is gibberish; "
              "pass --model DIR to run a real model", file=sys.stderr)
    for line in info.notes:
        print(f"note: {line}", file=sys.stderr)
    return engine


@dataclass
class Reply:
    """What one streamed request produced; ``error`` is set when a step failed part-way."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    ttft_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: StrataError | None = None
    markup: IncrementalDetokenizer | None = None    # the text with the model's special tokens kept (harmony's)

    def add(self, d: RequestDelta, echo: bool) -> None:
        new = d.new_text
        if self.markup is not None:
            new = self.markup.push(d.new_token_ids) + (self.markup.flush() if d.finished else "")
        self.text += new
        self.token_ids += d.new_token_ids
        self.ttft_ms = self.ttft_ms if d.ttft_ms is None else d.ttft_ms
        if echo and new:
            sys.stdout.write(for_terminal(new) if sys.stdout.isatty() else new)
            sys.stdout.flush()
        if d.finished:
            self.finish_reason = d.finish_reason
            self.prompt_tokens, self.completion_tokens = d.prompt_tokens, d.completion_tokens

    def summary(self) -> dict:
        """What ``--json`` prints: the text, token ids, finish reason and counts (not the error or the
        detokenizer that kept the markup)."""
        return {f.name: copy.copy(getattr(self, f.name)) for f in fields(self) if f.name not in ("error", "markup")}


# C0 and C1 control characters but newline and tab, in caret notation: a model's text written to a terminal
# must not clear the screen, recolour it, set its title or move the cursor ("\x1b[2J" shows as "^[[2J")
_CONTROLS = {c: f"^{chr(c ^ 64)}" for c in (*range(0x20), 0x7F) if chr(c) not in "\n\t"} | \
    {c: f"\\x{c:02x}" for c in range(0x80, 0xA0)}


def for_terminal(text: str) -> str:
    """``text`` safe to write to a terminal: its control characters shown, not obeyed."""
    return text.translate(_CONTROLS)


def stream(engine, prompt, params: SamplingParams, echo: bool = True, markup: bool = False,
           holder: list | None = None) -> Reply:
    """Run one request, writing text as it arrives.

    Ctrl-C ends the reply (finish reason "abort") and keeps what it said; a step that fails with a
    StrataError ends it too and comes back in ``Reply.error``. Either way the engine is left empty.
    ``holder``: the reply is appended to it as soon as it exists (what a second Ctrl-C leaves behind).
    """
    rid = engine.add_request(None, prompt, params)
    reply = Reply(markup=IncrementalDetokenizer(engine.tokenizer, skip_special_tokens=False) if markup else None)
    if holder is not None:
        holder.append(reply)
    try:
        while reply.finish_reason is None:
            for d in engine.step():
                if d.request_id == rid:
                    reply.add(d, echo)
    except KeyboardInterrupt:
        final = engine.abort_now(rid)
        if final is not None:
            reply.add(final, echo)
    except StrataError as e:
        engine.abort_now(rid)
        reply.finish_reason, reply.error = "error", e
    except BaseException:
        engine.abort_now(rid)
        raise
    return reply


def cmd_generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)          # a bad setting is refused before the model loads
    done: list[Reply] = []
    try:
        return _generate(args, params, done)
    except KeyboardInterrupt:               # outside the reply's own handling: before it, or once it ended
        reply = done[0] if done else None
        if reply is None or not reply.token_ids:
            print("\nnote: interrupted before the reply began; nothing was generated", file=sys.stderr)
        elif reply.finish_reason in (None, "abort"):
            print(f"\nnote: interrupted after {reply.completion_tokens} tokens; the reply is cut short",
                  file=sys.stderr)
        elif args.json:
            print("note: interrupted after the reply had ended, before its JSON summary", file=sys.stderr)
        else:
            print("\nnote: interrupted after the reply had ended; the text above is complete", file=sys.stderr)
        return 130


def _generate(args: argparse.Namespace, params: SamplingParams, done: list) -> int:
    engine = open_engine(args)
    try:
        try:
            fitted = fit_text(engine.tokenizer, args.prompt, engine.context_tokens, params.max_tokens,
                              args.context_overflow or GENERATE_OVERFLOW)
        except ContextOverflowError as e:        # the advice as this command takes it
            raise ContextOverflowError(str(e).replace(DROP_OLDEST_FIX, "pass --context-overflow drop-oldest"),
                                       e.droppable) from None
        if fitted.note:
            print(f"note: {fitted.note}", file=sys.stderr)
        # a harmony model's raw continuation keeps its markup: without the special tokens its channel names
        # run into the text ("analysisThink it over.assistantfinalHello")
        harmony = engine.tokenizer is not None and engine.tokenizer.harmony is not None
        reply = stream(engine, fitted.token_ids, params, echo=not args.json, markup=harmony, holder=done)
        stats = engine.stats()
    finally:
        engine.close()
    if not args.json:
        print()
    if reply.error is not None:
        raise reply.error
    if reply.finish_reason == "abort":          # Ctrl-C: what was said is kept, and the exit says it was cut
        print(f"note: interrupted after {reply.completion_tokens} tokens; the reply is cut short", file=sys.stderr)
    elif reply.finish_reason == "length" and reply.completion_tokens < params.max_tokens:
        print(f"note: the reply stopped after {reply.completion_tokens} tokens, at the end of the "
              f"{engine.context_tokens}-token context, before --max-tokens {params.max_tokens}", file=sys.stderr)
    if args.json:
        summary = reply.summary()
        summary["decode_tok_s"] = round(stats.decode_tok_s, 2)
        summary["model"] = engine.model_info.name
        print(json.dumps(summary, ensure_ascii=False))
    return 130 if reply.finish_reason == "abort" else 0
