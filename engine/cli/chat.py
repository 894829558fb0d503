"""The terminal chat: only /exit, /quit, the end of input (Ctrl-D) or Ctrl-C twice at the prompt end it.

Every turn is fitted to the context by the shared policy (``engine.context``); the whole conversation
stays in memory and in ``/save``, whatever part of it the model was shown. A turn that fails prints one
``error:`` line and leaves the conversation as it was before the turn.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

from engine.chat_format.harmony import DEFAULT_EFFORT, EFFORTS, HarmonyDelta, ReplyReader
from engine.chat_format.think import reasoning_reader
from engine.chat_template import TemplateFailure, TemplateFixes, failure_line
from engine.cli.run import CHAT_OVERFLOW, Reply, for_terminal, open_engine, sampling_params, stream
from engine.context import OVERFLOW_POLICIES, ContextOverflowError, FittedPrompt, fit_messages, fit_text
from engine.errors import ConfigError, StrataError
from engine.sampling import SamplingParams

HELP = """commands:
  /help                      this list
  /reset                     start a new conversation (the system prompt stays)
  /save FILE                 write the conversation to FILE: JSON if it ends in .json, else markdown;
                             an existing FILE is kept unless you add ! (/save FILE!)
  /context-overflow [POLICY] show or set what happens when the conversation outgrows the context:
                             drop-oldest (drop the oldest turns) or stop (refuse the turn)
  /reasoning [EFFORT]        show or set how hard a reasoning model thinks: low, medium or high
  /exit, /quit               leave (so does Ctrl-D)
Ctrl-C stops a reply; at the prompt, Ctrl-C twice leaves. Start a line with // to send text that begins with /."""
QUIT_HINT = "(press Ctrl-C again or type /exit to quit; /save FILE keeps the conversation)"
# What a chat template that failed leaves the terminal's user to do (the line names the template's file).
TEMPLATE_FIXES = TemplateFixes(fault="fix the template there and start the chat again",
                               system="start the chat again without --system",
                               other="/reset starts a new conversation, or fix the template there and start the "
                                     "chat again",
                               conversation="fix the template there and start the chat again")


class ChatSession:
    """One conversation in the terminal over an open engine."""

    def __init__(self, engine, params: SamplingParams, system: str | None, policy: str,
                 effort: str | None = None) -> None:
        self.engine, self.params, self.policy = engine, params, policy
        self.name = engine.model_info.name
        self.use_template = engine.tokenizer.has_chat_template and not engine.model_info.completion_only
        self.harmony = engine.tokenizer.harmony if self.use_template else None   # reasoning shown apart
        self.think = engine.tokenizer.think if self.use_template else None       # <think> tags: shown apart too
        self.effort = effort or DEFAULT_EFFORT
        self.effort_given = effort is not None             # --reasoning-effort, which only harmony models use
        self.system = [{"role": "system", "content": system}] if system else []
        self.messages: list[dict] = list(self.system)    # the whole conversation, never cut to fit
        self.dropped = 0                                  # what the previous prompt left out
        self._prompt_ids: list[int] = []                  # the last turn's prompt (where its reply began)

    def run(self) -> int:
        self._banner()
        interrupted = False
        while True:
            try:
                line = input("\n> ")
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                if interrupted:
                    print()
                    return 0
                interrupted = True
                print(f"\n{QUIT_HINT}")
                continue
            except UnicodeDecodeError:
                _error("the line is not UTF-8 text; set the terminal to UTF-8 (e.g. LANG=C.UTF-8) and type it again")
                continue
            interrupted = False
            if not self._handle(line):
                return 0

    def _banner(self) -> None:
        problem = getattr(self.engine.tokenizer, "template_problem", None)
        mode = ("chat" if self.use_template else
                "completion (its chat template cannot be used, see the note: your text is continued as written)"
                if problem else "completion (a base model: your text is continued as written)")
        print(f"Strata chat — {self.name}, {mode}. /help lists commands, /exit quits, Ctrl-C stops a reply.")
        if self.harmony is not None:
            print(f"A reasoning model: its thinking shows first{' (dimmed)' if sys.stdout.isatty() else ''}; "
                  f"/reasoning sets how hard it thinks (now {self.effort}).")
        elif self.think is not None:
            print(f"A reasoning model: its thinking shows first{' (dimmed)' if sys.stdout.isatty() else ''}.")
        if self.system and not self.use_template:
            _note("--system is not used: in completion mode your text is continued and there is no system prompt")
        if self.effort_given and self.harmony is None:
            if self.engine.model_info.architecture == "GptOssForCausalLM":
                _note("--reasoning-effort is not used: this gpt-oss checkpoint's tokenizer lacks the harmony format's "
                      "special tokens (<|channel|>, <|message|>, ...); use the tokenizer files the model was released with")
            else:
                _note("--reasoning-effort is not used: this model has no reasoning effort setting (gpt-oss models have)")

    def _handle(self, line: str) -> bool:
        """Act on one input line; False means leave."""
        text = line.strip()
        if not text:
            return True
        if not _is_text(line):
            _error("the line is not UTF-8 text; set the terminal to UTF-8 (e.g. LANG=C.UTF-8) and type it again")
            return True
        if text.startswith("//"):
            self._turn(text[1:])
        elif text.startswith("/"):
            return self._command(text)
        else:
            self._turn(line)
        return True

    def _command(self, text: str) -> bool:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            print(HELP)
        elif name == "/reset":
            self.messages, self.dropped = list(self.system), 0
            print("(conversation cleared)")
        elif name == "/save":
            self._save(arg)
        elif name == "/context-overflow":
            self._set_policy(arg)
        elif name == "/reasoning":
            self._set_effort(arg)
        else:
            _error(f"unknown command {name}; /help lists the commands (start a line with // to send text "
                   "that begins with /)")
        return True

    # ---- a turn -----------------------------------------------------------------------------------
    def _turn(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        try:
            fitted = self._fit()
            self._say_dropped(fitted)
            reader = reasoning_reader(self.engine.tokenizer, fitted.token_ids) if self.use_template else None
            if reader is not None:
                reply = stream(_Shown(self.engine, reader), fitted.token_ids, self.params, echo=False)
            else:
                reply = stream(self.engine, fitted.token_ids, self.params)
            self._prompt_ids = fitted.token_ids
        except TemplateFailure as e:      # the model folder's chat template failed: the turn never happened
            self.messages.pop()
            _error(failure_line(e, TEMPLATE_FIXES))
            return
        except StrataError as e:          # refused before anything was said: the turn never happened
            self.messages.pop()
            _error(e)
            if isinstance(e, ContextOverflowError) and e.droppable:
                _note("/reset starts a new chat; /context-overflow drop-oldest drops the oldest turns instead")
            return
        except KeyboardInterrupt:
            self.messages.pop()
            print("\n(stopped)")
            return
        print()
        self._keep(reply)

    def _fit(self) -> FittedPrompt:
        tok, ctx, max_tokens = self.engine.tokenizer, self.engine.context_tokens, self.params.max_tokens
        if self.harmony is not None:
            return fit_messages(self.harmony.prompter(self.effort), self.messages, ctx, max_tokens, self.policy)
        if self.use_template:
            return fit_messages(tok, self.messages, ctx, max_tokens, self.policy)
        newest = self.messages[-1]["content"] if self.messages and self.messages[-1]["role"] == "user" else None
        return fit_text(tok, _continuation(self.messages), ctx, max_tokens, self.policy, newest=newest)

    def _say_dropped(self, fitted: FittedPrompt) -> None:
        dropped = fitted.dropped_messages or fitted.dropped_tokens
        if dropped > self.dropped:
            _note(fitted.note)
        self.dropped = dropped

    def _keep(self, reply: Reply) -> None:
        """Add what the reply said to the conversation (a stopped reply keeps its part)."""
        if self.harmony is not None and (reply.token_ids or reply.error is None):
            said = self.harmony.parse(reply.token_ids)
            message = {"role": "assistant", "content": said.content}
            self.messages.append({**message, "reasoning_content": said.reasoning} if said.reasoning else message)
        elif self.think is not None and (reply.token_ids or reply.error is None):
            # the answer alone goes back into the prompt, as the template would keep it
            said = self.think.parse(self.engine.tokenizer, reply.token_ids, self._prompt_ids)
            self.messages.append({"role": "assistant", "content": said.content})
        elif reply.text or reply.error is None:
            self.messages.append({"role": "assistant", "content": reply.text})
        else:
            self.messages.pop()           # failed before a word: as if the turn never happened
        if reply.error is not None:
            _error(reply.error)
        elif reply.finish_reason == "abort":
            print("(stopped)")
        elif reply.finish_reason == "length" and reply.completion_tokens < self.params.max_tokens:
            _note(f"the reply reached the end of the {self.engine.context_tokens}-token context")

    # ---- commands -----------------------------------------------------------------------------------
    def _set_policy(self, arg: str) -> None:
        if arg and arg not in OVERFLOW_POLICIES:
            _error(ConfigError(f"context-overflow policy must be one of {', '.join(OVERFLOW_POLICIES)} "
                               f"(got {arg!r})"))
            return
        self.policy = arg or self.policy
        print(f"(context-overflow: {self.policy})")

    def _set_effort(self, arg: str) -> None:
        if self.harmony is None:
            if self.engine.model_info.architecture == "GptOssForCausalLM":
                _note("this gpt-oss checkpoint's tokenizer lacks the harmony format's special tokens (<|channel|>, "
                      "<|message|>, ...), so /reasoning has nothing to set; use the tokenizer files the model was "
                      "released with")
            else:
                _note("this model has no reasoning effort setting; /reasoning applies to reasoning models (gpt-oss)")
            return
        if arg and arg not in EFFORTS:
            _error(ConfigError(f"reasoning effort must be one of {', '.join(EFFORTS)} (got {arg!r})"))
            return
        self.effort = arg or self.effort
        print(f"(reasoning: {self.effort})")

    def _save(self, arg: str) -> None:
        if not arg:
            _error("/save needs a file name, e.g. /save chat.md (a name ending in .json writes JSON)")
            return
        replace = arg.endswith("!")
        path = Path(arg[:-1] if replace else arg).expanduser()
        problem = _save_problem(path, replace)
        if problem:
            _error(problem)
            return
        body = self._as_json() if path.suffix.lower() == ".json" else self._as_markdown()
        try:
            _write_atomically(path, body)
        except OSError as e:
            _error(f"cannot write {path} ({e.strerror or e}); choose another path")
            return
        print(f"(saved {len(self.messages)} messages to {path})")

    def _as_json(self) -> str:
        mode = "chat" if self.use_template else "completion"
        doc = {"model": self.name, "mode": mode, "context_overflow": self.policy, "messages": self.messages}
        return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"

    def _as_markdown(self) -> str:
        parts = [f"# Strata chat — {self.name}"] + [f"### {m['role']}\n\n{m['content']}" for m in self.messages]
        return "\n\n".join(parts) + "\n"


class _Shown:
    """The engine as ``stream`` drives it, with one request's reply read apart (harmony, or <think> tags)
    and printed as it passes: the reasoning dimmed (plain text when stdout is not a terminal), then the
    answer."""

    def __init__(self, engine, reader: ReplyReader) -> None:
        self.engine, self.reader = engine, reader
        self.request_id: str | None = None
        self.reasoned = False          # reasoning has been printed and the answer has not begun

    def add_request(self, request_id, prompt, params: SamplingParams):
        self.request_id = self.engine.add_request(request_id, prompt, params)
        return self.request_id

    def step(self):
        deltas = self.engine.step()
        for d in deltas:
            if d.request_id == self.request_id:
                self._show(self.reader.feed(d.new_token_ids), d.finished)
        return deltas

    def abort_now(self, request_id):
        final = self.engine.abort_now(request_id)
        if final is not None:
            self._show(self.reader.feed(final.new_token_ids), True)
        return final

    def _show(self, delta: HarmonyDelta, finished: bool) -> None:
        if finished:
            delta += self.reader.finish()
        dim = sys.stdout.isatty()
        shown = for_terminal if dim else str         # on a terminal, the model's control characters shown, not obeyed
        if delta.reasoning:
            sys.stdout.write(("\x1b[2m" if dim and not self.reasoned else "") + shown(delta.reasoning))
            self.reasoned = True
        answer = delta.content + delta.cut_call + "".join(f"(calls {c.name} {c.arguments})" for c in delta.calls)
        if self.reasoned and (answer or finished):
            sys.stdout.write(("\x1b[0m" if dim else "") + ("\n\n" if answer else ""))
            self.reasoned = False
        sys.stdout.write(shown(answer))
        sys.stdout.flush()


def _continuation(messages: list[dict]) -> str:
    """A base model's prompt: the user's lines and the model's continuations, as typed and said."""
    text = ""
    for m in messages:
        if m["role"] == "user":
            text += ("\n" if text else "") + m["content"]
        elif m["role"] == "assistant":
            text += m["content"]
    return text


def _is_text(line: str) -> bool:
    # stdin decodes undecodable bytes to lone surrogates (see cmd_chat); they are not text
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _save_problem(path: Path, replace: bool) -> str | None:
    """Why ``path`` cannot take the transcript, as one line (None when it can)."""
    if path.is_dir():
        return f"{path} is a folder; give a file name, e.g. /save {path / 'chat.md'}"
    if path.exists() and not replace:
        return f"{path} already exists and is kept; choose another name, or add ! to replace it (/save {path}!)"
    if not path.parent.is_dir():
        return f"the folder {path.parent} does not exist; create it or choose another path"
    return None


def _write_atomically(path: Path, text: str) -> None:
    """Write, flush to disk, then rename over ``path``: a crash leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _error(e: StrataError | str) -> None:
    print(f"error: {e}", file=sys.stderr)


def _note(text: str) -> None:
    dim = sys.stderr.isatty()
    print(f"\x1b[2mnote: {text}\x1b[0m" if dim else f"note: {text}", file=sys.stderr)


def cmd_chat(args: argparse.Namespace) -> int:
    if isinstance(sys.stdin, io.TextIOWrapper):
        # Bytes that are not text become one refused line instead of an exception that ends the chat.
        sys.stdin.reconfigure(errors="surrogateescape")
    params = sampling_params(args)
    engine = open_engine(args)
    try:
        session = ChatSession(engine, params, args.system, args.context_overflow or CHAT_OVERFLOW,
                              args.reasoning_effort)
        return session.run()
    finally:
        engine.close()
