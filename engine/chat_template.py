"""A model folder's chat template: compiled in a sandbox with the helpers Hugging Face templates expect,
rendered, and its failures told apart in one line each front end words alike.

A template fails in one of three ways, each its own exception carrying the template's own words (``cause``),
the template line it stopped at and the file it came from (``origin``):

- ``ChatTemplateSyntaxError``: it does not parse (found at load; chat is refused, plain prompts still work);
- ``ChatTemplateRefusal``: it refused the conversation through its ``raise_exception``; ``role`` is the role
  of the message it refused, where one message can be blamed (None when the refusal holds without it);
- ``ChatTemplateFault``: it failed on its own (an undefined variable, a type it cannot handle, any other
  error raised while it ran).

:func:`failure_line` words each as one line: the template failed, its words and line, then a fix the front
end that shows the line chooses (:class:`TemplateFixes`): the CLI's, the workbench's and the server's differ.
"""
from __future__ import annotations

import json
import traceback
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from engine.errors import StrataError, printable

_TEMPLATE_FILE = "<template>"        # the file name Jinja gives a template compiled from a string
_CAUSE_CHARS = 300                   # a template's words in a failure line, at most (they may quote a message)
_ROLE_CHARS = 40                     # a refused message's role (the caller's text) in a failure line, at most
_SEARCHED = 4096                     # the longest conversation whose refused message is searched for by bisection


@dataclass(frozen=True)
class TemplateOrigin:
    """Where a model folder's chat template was read from."""

    path: Path                 # chat_template.jinja, or the tokenizer_config.json holding it
    key: str | None = None     # the JSON field holding it ("chat_template"); None for a template file

    def __str__(self) -> str:
        return str(self.path) if self.key is None else f"{self.key} in {self.path}"


@dataclass(frozen=True)
class TemplateFixes:
    """What the person reading the line can do about a failed chat template, in their front end's words."""

    fault: str           # the template failed on its own, or does not parse
    system: str          # it refused a system message
    other: str           # it refused another message
    conversation: str    # it refused the conversation as a whole: no one message could be blamed


#: The fixes of a line read without knowing the front end (``str`` of the exceptions).
DEFAULT_FIXES = TemplateFixes(fault="fix the template there",
                              system="change the messages to the roles and order this model expects",
                              other="change the messages to the roles and order this model expects",
                              conversation="give the conversation what the template's words ask for, or fix the "
                                           "template there")


class ChatTemplateError(StrataError):
    """The conversation could not be rendered with the model's chat template."""


class TemplateFailure(ChatTemplateError):
    """The template itself failed: ``cause`` is its own message, ``line`` the template line it stopped at
    (None when unknown), ``origin`` the file it came from (None when it was given as text)."""

    verb = "failed"

    def __init__(self, cause: str, line: int | None, origin: TemplateOrigin | None) -> None:
        self.cause, self.line, self.origin = cause, line, origin
        super().__init__(failure_line(self, DEFAULT_FIXES))

    def fix(self, fixes: TemplateFixes) -> str:
        return fixes.fault


class ChatTemplateSyntaxError(TemplateFailure):
    """The template does not parse."""

    verb = "does not parse"


class ChatTemplateFault(TemplateFailure):
    """The chat template failed on its own (an undefined value, a type it cannot handle) rather than refusing
    the conversation through its ``raise_exception``. Messages of the shape templates are written for (as the
    front ends send) make this the template's fault, not the caller's."""


class ChatTemplateRefusal(TemplateFailure):
    """The template refused the conversation through its ``raise_exception``; ``role`` is the role of the
    message it refused (None when no one message's removal lets the conversation through)."""

    def __init__(self, cause: str, line: int | None, origin: TemplateOrigin | None, role: str | None) -> None:
        self.role = role
        super().__init__(cause, line, origin)

    @property
    def verb(self) -> str:
        if not self.role:
            return "refused the conversation"
        role = printable(self.role, _ROLE_CHARS)      # the caller's text: one line, however it was sent
        return f"refused {'an' if role[:1] in 'aeio' else 'a'} {role} message"    # a user, an assistant

    def fix(self, fixes: TemplateFixes) -> str:
        if not self.role:
            return fixes.conversation
        return fixes.system if self.role == "system" else fixes.other


def failure_line(exc: TemplateFailure, fixes: TemplateFixes, show_files: bool = True) -> str:
    """One line for a template that failed: what it did, its own words and where, then the fix of ``fixes``
    that fits. ``show_files`` names the model folder's file (for the person who has the folder); without it
    the line names only the template's line (for an HTTP client, who cannot see the server's files)."""
    place = ""
    if exc.line is not None:
        place = f" at line {exc.line} of {exc.origin}" if show_files and exc.origin else f" at its line {exc.line}"
    elif show_files and exc.origin:
        place = f" in {exc.origin}"
    subject = "the model folder's chat template" if show_files else "the model's chat template"
    return f"{subject} {exc.verb}{place} ({printable(exc.cause, _CAUSE_CHARS)}); {exc.fix(fixes)}"


# ---- the sandbox ---------------------------------------------------------------------------------------------

class _TemplateRaised(jinja2.exceptions.TemplateError):
    """What a chat template's ``raise_exception`` raises: the template refusing the conversation."""


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the prompt the model sees.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; render it as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def compile_chat_template(source: str, origin: TemplateOrigin | None = None) -> jinja2.Template:
    """Compile a chat template in a sandbox with the helpers Hugging Face templates expect;
    ChatTemplateSyntaxError when it does not parse."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateSyntaxError(exc.message or str(exc), exc.lineno, origin) from exc


class ChatTemplate:
    """A compiled chat template and the file it came from."""

    def __init__(self, source: str, origin: TemplateOrigin | None = None) -> None:
        self.source, self.origin = source, origin
        self._template = compile_chat_template(source, origin)

    def render(self, messages: list[dict], add_generation_prompt: bool, variables: dict[str, Any]) -> str:
        """The prompt text of ``messages``; ChatTemplateRefusal or ChatTemplateFault when the template fails."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **variables)
        except _TemplateRaised as exc:
            role = self._refused_role(messages, add_generation_prompt, variables, str(exc))
            raise ChatTemplateRefusal(str(exc), _template_line(exc), self.origin, role) from exc
        except Exception as exc:     # the template is code from the model folder: whatever it raises is its fault
            raise ChatTemplateFault(str(exc) or type(exc).__name__, _template_line(exc), self.origin) from exc

    def _refused_role(self, messages: list[dict], add_generation_prompt: bool, variables: dict[str, Any],
                      cause: str) -> str | None:
        """The role of the message the template refused with ``cause``, or None when no one message can be blamed.

        A template checks each message as its loop reaches it, so bisection over prefixes finds the message
        that turns an accepted prefix into one refused with the same words (where refusal is monotone in the
        prefix, the first; where not, a boundary). A rule that is not about each message as it comes (the
        last message must be the user's; at most so many messages) can put that boundary on a message that is
        not to blame, so each message considered counts only if the conversation without it is not refused
        with the same words: the one bisection found, then the first (a rule about the first message, or the
        whole request), then the last (a rule about the conversation's end). At most ceil(log2 N) + 3
        renders; past ``_SEARCHED`` messages only the last message is tried (one render), as each render
        costs as much as the conversation is long."""
        def refused(subset: list[dict]) -> bool:
            try:
                self._template.render(messages=subset, add_generation_prompt=add_generation_prompt, **variables)
            except _TemplateRaised as exc:
                return str(exc) == cause
            except Exception:        # failing otherwise is not the same refusal
                return False
            return False

        n = len(messages)
        if not n:
            return None
        accepted = 0                 # the longest prefix rendered and accepted (0: none was)
        lo, hi = (0, n) if n <= _SEARCHED else (n - 1, n)       # messages[:hi] is refused
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if refused(messages[:mid]):
                hi = mid
            else:
                lo = accepted = mid
        found = [hi - 1] if accepted else []     # messages[:hi - 1] gets through and messages[:hi] does not
        first = 0 if n <= _SEARCHED else n - 1
        for at in dict.fromkeys(found + [first, n - 1]):
            if not refused(messages[:at] + messages[at + 1:]):
                return _role(messages[at])
        return None


def _role(message: object) -> str | None:
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) and role else None


def _template_line(exc: BaseException) -> int | None:
    """The template line ``exc`` was raised at: Jinja gives a rendering template's frames its own line numbers."""
    lines = [line for frame, line in traceback.walk_tb(exc.__traceback__)
             if frame.f_code.co_filename == _TEMPLATE_FILE]
    return lines[-1] if lines else None
