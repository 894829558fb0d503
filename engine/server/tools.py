"""Tool calls: OpenAI ``tools`` / ``tool_choice`` on a model whose chat template renders tools.

A template supports tools when it reads the ``tools`` variable. Two call syntaxes are read, the ones
the supported families' templates teach their models:

- Hermes / Qwen: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call;
- Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``, one list holding every call.

``tool_choice``:

- ``"none"``: the tools are checked but left out of the prompt, and the reply is plain content, never
  read for calls (a model that is not shown the tools has nothing to call);
- ``"auto"`` (the default with tools): the tools are rendered and calls are read out of the reply;
- ``"required"``: the reply is forced to be one or more calls (one with ``parallel_tool_calls`` false),
  each naming one of the tools, with arguments that follow that tool's ``parameters`` schema;
- ``{"type": "function", "function": {"name": N}}``: the reply is forced to be exactly one call of N.

A forced reply starts with the call: no text (and no thinking) comes before it.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import jinja2

from engine.guided import Guide
from engine.server.chat_messages import render_messages
from engine.server.fields import show
from engine.server.structured import FieldError, closed_objects, kind_of, refuse_unknown, schema_problem
from engine.server.tool_parse import (HERMES, MISTRAL, ContentDelta, ToolCall, ToolCallDelta, ToolCallFormat,
                                       ToolStreamParser, ToolSyntax, parse_tool_calls)

__all__ = ["FunctionTool", "ToolCall", "ToolCallDelta", "ContentDelta", "ToolPlan", "ToolSyntax",
           "ToolCallFormat", "ToolStreamParser", "plan_tools", "parse_tool_calls", "render_messages"]

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# The grammar writes arguments the way json.dumps and the templates' tojson do, so a forced call looks
# like the calls the model saw in its prompt, and a model cannot pad it with endless whitespace.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# The fields OpenAI gives a tool, its function, a named tool_choice and its function. A function's
# strict (arguments exactly as its schema says) is checked; a forced call follows the schema either way.
_TOOL_FIELDS = frozenset({"type", "function"})
_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
_CHOICE_FIELDS = frozenset({"type", "function"})
_CHOICE_FUNCTION_FIELDS = frozenset({"name"})


class TemplateTokenizer(Protocol):
    """What tool planning reads of a tokenizer (engine/tokenizer.py ``Tokenizer``)."""

    chat_template: str | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class FunctionTool:
    """One entry of ``tools``, checked."""

    name: str
    description: str | None = None
    parameters: dict | None = None      # JSON schema of the arguments object

    def as_openai(self) -> dict:
        """The tool in OpenAI's shape, as sent: without parameters when it has none (harmony writes such a
        tool as ``() => any``)."""
        function: dict = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def as_template_tool(self) -> dict:
        """The tool as chat templates read it: the OpenAI shape with parameters always there, an object of no
        properties when the request gave none (OpenAI allows that; templates write ``parameters | tojson``)."""
        tool = self.as_openai()
        tool["function"].setdefault("parameters", {"type": "object", "properties": {}})
        return tool


@dataclass(frozen=True)
class ToolPlan:
    """What a request's ``tools`` / ``tool_choice`` mean for its prompt, its decoding and its reply."""

    tools: tuple[FunctionTool, ...] = ()
    template_vars: dict = field(default_factory=dict)   # extra chat-template variables: {"tools": [...]}
    guide: Guide | None = None            # forces the reply into calls ("required", a named function)
    parser: ToolCallFormat | None = None  # reads calls out of the reply; None: the reply is plain content


# Planning: tools and tool_choice checked, the template's syntax found, the guide written.


def plan_tools(tools: list[dict] | None, tool_choice: object, tokenizer: TemplateTokenizer,
               parallel_tool_calls: bool | None = True) -> ToolPlan:
    """Check ``tools`` / ``tool_choice`` against the model's chat template and say how to serve them.

    ``parallel_tool_calls`` false lets a "required" reply hold one call only. Raises FieldError (a
    ConfigError) naming the field (``tools[1].function.name``, ``tool_choice``, ...) for anything
    malformed, a named function that is not among the tools, or tools on a template that renders none.
    """
    functions = _functions(tools)
    parallel_tool_calls = True if parallel_tool_calls is None else parallel_tool_calls    # null: the default
    if not isinstance(parallel_tool_calls, bool):
        raise FieldError("parallel_tool_calls", "parallel_tool_calls must be true or false "
                                                f"(got {kind_of(parallel_tool_calls)})")
    choice, forced = _choice(tool_choice, functions)
    if choice == "none" or not functions:
        return ToolPlan(tools=functions)
    syntax = tool_syntax(tokenizer)
    template_vars = {"tools": [f.as_template_tool() for f in functions]}
    parser = ToolCallFormat(syntax, frozenset(f.name for f in functions))
    guide = None
    if choice != "auto":
        allowed = [f for f in functions if forced is None or f.name == forced]
        _check_enforceable(functions, allowed)
        guide = Guide("lark", tool_grammar(syntax, allowed, many=forced is None and parallel_tool_calls),
                      source="tool_choice")
    return ToolPlan(functions, template_vars, guide, parser)


def _functions(tools: object) -> tuple[FunctionTool, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise FieldError("tools", "tools must be a list of {\"type\": \"function\", \"function\": {\"name\": "
                                  f"...}}}} objects (got {kind_of(tools)})")
    functions: list[FunctionTool] = []
    for i, tool in enumerate(tools):
        function = _function(f"tools[{i}]", tool)
        for j, earlier in enumerate(functions):
            if earlier.name == function.name:
                raise FieldError(f"tools[{i}].function.name", f"tools[{i}].function.name {show(function.name)} is "
                                 f"also the name of tools[{j}]; give each tool its own name")
        functions.append(function)
    return tuple(functions)


def _function(where: str, tool: object) -> FunctionTool:
    if not isinstance(tool, dict):
        raise FieldError(where, f"{where} must be an object such as {{\"type\": \"function\", \"function\": "
                                f"{{\"name\": ...}}}} (got {kind_of(tool)})")
    if tool.get("type") != "function":
        raise FieldError(f"{where}.type", f"{where}.type must be \"function\" (got {show(tool.get('type'))}); "
                                          "function tools are the only kind")
    refuse_unknown(tool, _TOOL_FIELDS, "a tool", where)
    spec = tool.get("function")
    if not isinstance(spec, dict):
        raise FieldError(f"{where}.function", f"{where}.function must be an object with a name "
                                              f"(got {kind_of(spec)})")
    refuse_unknown(spec, _FUNCTION_FIELDS, "a tool's function", f"{where}.function")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FieldError(f"{where}.function.name", f"{where}.function.name must be 1 to 64 letters, digits, "
                                                   f"'_', '-' or '.' (got {show(name)})")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise FieldError(f"{where}.function.description", f"{where}.function.description must be a string "
                                                          f"(got {kind_of(description)})")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise FieldError(f"{where}.function.strict", f"{where}.function.strict must be true or false "
                                                     f"(got {kind_of(strict)})")
    return FunctionTool(name, description, _parameters(f"{where}.function.parameters", spec.get("parameters")))


def _parameters(where: str, schema: object) -> dict | None:
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise FieldError(where, f"{where} must be a JSON schema object such as {{\"type\": \"object\", "
                                f"\"properties\": {{...}}}} (got {kind_of(schema)})")
    if schema.get("type", "object") != "object":
        raise FieldError(where, f"{where} must describe an object (its type is {show(schema.get('type'))}); "
                                "arguments are always a JSON object, so put the values in its properties")
    return schema


def _choice(tool_choice: object, functions: Sequence[FunctionTool]) -> tuple[str, str | None]:
    """("none" | "auto" | "required" | "function", the named function or None)."""
    if tool_choice is None:
        return ("auto" if functions else "none"), None
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not functions:
            raise FieldError("tool_choice", "tool_choice \"required\" needs tools to call; send tools, or "
                                            "leave tool_choice out")
        return str(tool_choice), None
    named = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(named, dict) or tool_choice.get("type") != "function":
        raise FieldError("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
                         f"\"function\", \"function\": {{\"name\": ...}}}} (got {_short(tool_choice)})")
    refuse_unknown(tool_choice, _CHOICE_FIELDS, "tool_choice", "tool_choice")
    refuse_unknown(named, _CHOICE_FUNCTION_FIELDS, "tool_choice.function", "tool_choice.function")
    name = named.get("name")
    names = [f.name for f in functions]
    if name not in names:
        known = f"the tools are {', '.join(names)}" if names else "no tools were sent"
        raise FieldError("tool_choice.function.name", f"tool_choice.function.name {_short(name)} is not one of "
                                                      f"the tools ({known}); name one of them, or use \"auto\"")
    return "function", name


def _short(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def tool_syntax(tokenizer: TemplateTokenizer) -> ToolSyntax:
    """The call syntax the model's chat template teaches; FieldError on ``tools`` when it renders none."""
    template = tokenizer.chat_template
    if not template or not _reads_variable(template, "tools"):
        raise FieldError("tools", "this model's chat template does not support tools; send the request without "
                                  "tools (or with tool_choice \"none\"), or serve a model whose template renders tools")
    for syntax in (HERMES, MISTRAL):
        if syntax.marker in template:
            return _with_tokens(syntax, tokenizer)
    raise FieldError("tools", "this model's chat template renders tools but not in a call format Strata reads "
                              "(<tool_call> or [TOOL_CALLS]); send the request without tools, or with "
                              "tool_choice \"none\"")


def _reads_variable(template: str, name: str) -> bool:
    # The lexer sees names in expressions only, so "tools" in the template's prose does not count.
    try:
        return any(kind == "name" and value == name for _, kind, value in jinja2.Environment().lex(template))
    except jinja2.exceptions.TemplateSyntaxError:
        return False      # the tokenizer already refused such a template when it loaded


def _with_tokens(syntax: ToolSyntax, tokenizer: TemplateTokenizer) -> ToolSyntax:
    """``syntax`` with what this model's tokens make of its markers.

    A marker that is one token is written as that token in grammars: the model was trained on it, and
    the grammar library may hold such a token (any added ``<...>``) apart from the text it spells. A
    marker that decoding drops (a special token) leaves a Mistral list bare in the reply text; a
    dropped ``<tool_call>`` would leave nothing to find a call by.
    """
    marker_token, marker_hidden = _as_token(syntax.marker, tokenizer)
    close_token, close_hidden = _as_token(syntax.close, tokenizer) if syntax.close else (None, False)
    if not syntax.listed and (marker_hidden or close_hidden):
        raise FieldError("tools", f"this model's tokenizer drops {syntax.marker} from decoded text, so its tool "
                                  "calls cannot be read; send the request without tools")
    return ToolSyntax(**{**vars(syntax), "marker_token": marker_token, "close_token": close_token,
                         "marker_hidden": marker_hidden})


def _as_token(text: str, tokenizer: TemplateTokenizer) -> tuple[int | None, bool]:
    """(the id of ``text`` when it is one token, whether decoding drops it)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return (ids[0] if len(ids) == 1 else None), text not in tokenizer.decode(ids)


def tool_grammar(syntax: ToolSyntax, functions: Sequence[FunctionTool], many: bool) -> str:
    """An llguidance Lark grammar for calls of ``functions`` written in ``syntax``.

    One call, or (``many``) one or more joined by the syntax's separator. Each call is the object
    ``{"name": N, "arguments": A}`` with A following N's parameters schema (llguidance's ``%json``).
    """
    marker = f"{_piece(syntax.marker, syntax.marker_token)} {_literal(syntax.opening)}"
    one_of = "(" + " | ".join(f"fn_{i}" for i in range(len(functions))) + ")"
    calls = f"call ({_literal(syntax.separator)} call)*" if many else "call"
    if syntax.listed:
        lines = [f"start: {marker} {calls} {_literal(syntax.list_end)}", f"call: {one_of}"]
    else:
        close = f"{_literal(syntax.closing)} {_piece(syntax.close, syntax.close_token)}"
        lines = [f"start: {calls}", f"call: {marker} {one_of} {close}"]
    for i, f in enumerate(functions):
        head = "{" + f"\"name\": {json.dumps(f.name)}, \"arguments\": "
        lines.append(f"fn_{i}: {_literal(head)} args_{i} {_literal('}')}")
        lines.append(f"args_{i}: %json {json.dumps(_arguments_schema(f))}")
    return "\n".join(lines) + "\n"


def _piece(text: str, token: int | None) -> str:
    return f"<[{token}]>" if token is not None else _literal(text)


def _check_enforceable(functions: Sequence[FunctionTool], forced: Sequence[FunctionTool]) -> None:
    for i, f in enumerate(functions):
        problem = schema_problem(f.parameters) if f in forced and f.parameters else None
        if problem is not None:
            where = f"tools[{i}].function.parameters"
            raise FieldError(where, f"{where} cannot be enforced ({problem}); fix that part of the schema, "
                                    "or use tool_choice \"auto\"")


def _arguments_schema(function: FunctionTool) -> dict:
    schema = dict(function.parameters) if function.parameters is not None else {}
    schema.setdefault("type", "object")
    schema = closed_objects(schema)
    schema["x-guidance"] = _COMPACT
    return schema


def _literal(text: str) -> str:
    # Lark string literals take JSON's escapes.
    return json.dumps(text)
