"""Tool calls: tools and tool_choice checked against the chat template, forced calls as a grammar that
takes exactly the calls of the tools with arguments that follow their schemas, calls read out of a
reply whole or streamed, and OpenAI messages rendered for a template."""
from __future__ import annotations

import json
import re

import llguidance
import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from engine import LLM, SamplingParams
from engine.errors import ConfigError
from engine.server.structured import FieldError
from engine.server.tool_parse import HERMES, MISTRAL
from engine.server.tools import (ContentDelta, ToolCallDelta, ToolPlan, ToolStreamParser, parse_tool_calls,
                                 plan_tools, render_messages)
from engine.tokenizer import Tokenizer
from tests.engine.tokenizer_fixtures import CHAT_TEMPLATE, build_tiny_tokenizer
from tiny_models import TOOLS_CHAT_TEMPLATE, build_tiny_tools_model

# bounded arguments: a random model fills unbounded strings until max_tokens
WEATHER_ARGS = {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TIME_ARGS = {"type": "object", "properties": {"zone": {"enum": ["utc", "local"]}}, "required": ["zone"],
             "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME_ARGS}}]
CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def weather(city: str = "Paris", unit: str = "c") -> str:
    return ('<tool_call>\n{"name": "get_weather", "arguments": '
            + json.dumps({"city": city, "unit": unit}) + '}\n</tool_call>')


def follows(name: str, arguments: dict) -> bool:
    """``arguments`` is valid against the named tool's schema (a validator for exactly its keywords)."""
    if name == "get_time":
        return set(arguments) == {"zone"} and arguments["zone"] in ("utc", "local")
    return (set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str)
            and len(arguments["city"]) <= 10 and arguments["unit"] in ("c", "f"))


_TOKENIZER_JSON: dict[int, str] = {}     # id(Tokenizer) -> the text of its tokenizer.json, for llguidance


def tokenizer_with(folder, template: str | None, special_marker: str | None = None) -> Tokenizer:
    build_tiny_tokenizer(folder, vocab_size=512, chat_template=template)
    if special_marker is not None:      # a marker the tokenizer holds as a special token, as Mistral's do
        backend = Backend.from_file(str(folder / "tokenizer.json"))
        backend.add_special_tokens([AddedToken(special_marker, special=True, normalized=False)])
        backend.save(str(folder / "tokenizer.json"))
    tokenizer = Tokenizer.from_dir(folder)
    _TOKENIZER_JSON[id(tokenizer)] = (folder / "tokenizer.json").read_text(encoding="utf-8")
    return tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A tokenizer whose template renders tools and teaches <tool_call> blocks."""
    return tokenizer_with(tmp_path_factory.mktemp("tools_tok"), TOOLS_CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def plain_tok(tmp_path_factory):
    """A tokenizer whose template knows nothing of tools."""
    return tokenizer_with(tmp_path_factory.mktemp("plain_tok"), CHAT_TEMPLATE)


def accepts(tokenizer: Tokenizer, grammar: str, text: str, prefix_ids: tuple[int, ...] = ()) -> bool:
    """Whether ``grammar`` takes ``text`` whole (after ``prefix_ids``) and is then complete."""
    lltok = llguidance.LLTokenizer(tokenizer_json(tokenizer))
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids = list(prefix_ids) + tokenizer.encode(text, add_special_tokens=False)
    return matcher.consume_tokens(ids) and matcher.is_accepting()


def tokenizer_json(tokenizer: Tokenizer) -> str:
    return _TOKENIZER_JSON[id(tokenizer)]


# ---- planning ---------------------------------------------------------------------------------------


def test_auto_renders_the_tools_and_reads_calls_without_forcing_them(tok):
    plan = plan_tools(TOOLS, "auto", tok)
    assert plan.guide is None
    assert plan.parser.syntax == HERMES and plan.parser.names == {"get_weather", "get_time"}
    assert plan.template_vars == {"tools": TOOLS}
    prompt = tok.apply_chat_template(render_messages([{"role": "user", "content": "Hi"}]), **plan.template_vars)
    assert json.dumps(TOOLS[0]) in prompt and "<tool_call>" in prompt


def test_tools_default_to_auto_and_no_tools_mean_plain_content(tok):
    assert plan_tools(TOOLS, None, tok).parser is not None
    for tools in (None, []):
        plan = plan_tools(tools, None, tok)
        assert plan == ToolPlan() and plan.template_vars == {}


def test_none_leaves_the_tools_out_and_the_reply_unread_even_on_a_template_without_tools(plain_tok):
    plan = plan_tools(TOOLS, "none", plain_tok)
    assert plan.template_vars == {} and plan.guide is None and plan.parser is None
    text = weather() + "\n"
    assert parse_tool_calls(text, plan) == (text, [])


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, None, CHAT_TEMPLATE.replace("You are a helpful assistant.",
                                                                                  "You have no tools.")])
def test_a_template_that_does_not_render_tools_is_refused(tmp_path, template):
    tokenizer = tokenizer_with(tmp_path, template)
    with pytest.raises(FieldError) as err:
        plan_tools(TOOLS, "auto", tokenizer)
    assert str(err.value).startswith("this model's chat template does not support tools; send the request "
                                     "without tools (or with tool_choice \"none\")")
    assert err.value.param == "tools"


def test_a_template_that_renders_tools_in_another_call_format_is_refused(tmp_path):
    template = "{% for t in tools %}<function>{{ t | tojson }}</function>{% endfor %}" + CHAT_TEMPLATE
    with pytest.raises(ConfigError, match=r"renders tools but not in a call format Strata reads \(<tool_call> "
                                          r"or \[TOOL_CALLS\]\)"):
        plan_tools(TOOLS, "auto", tokenizer_with(tmp_path, template))


def fn(**function) -> dict:
    return {"type": "function", "function": function}


@pytest.mark.parametrize("tools,choice,param,message", [
    ({"type": "function"}, "auto", "tools", "tools must be a list of"),
    ([TOOLS[0], "get_time"], "auto", "tools[1]", "tools[1] must be an object such as"),
    ([{"type": "retrieval", "function": {"name": "x"}}], "auto", "tools[0].type",
     "tools[0].type must be \"function\" (got \"retrieval\")"),
    ([{"type": "function"}], "auto", "tools[0].function", "tools[0].function must be an object with a name (got null)"),
    ([fn(description="no name")], "auto", "tools[0].function.name", "tools[0].function.name must be 1 to 64"),
    ([TOOLS[0], fn(name="get time")], "auto", "tools[1].function.name", "(got \"get time\")"),
    ([fn(name="x" * 65)], "auto", "tools[0].function.name", "tools[0].function.name must be 1 to 64"),
    ([TOOLS[0], TOOLS[1], fn(name="get_weather")], "auto", "tools[2].function.name",
     "tools[2].function.name \"get_weather\" is also the name of tools[0]; give each tool its own name"),
    ([fn(name="f", description=3)], "auto", "tools[0].function.description", "must be a string (got a number)"),
    ([fn(name="f", parameters=[{"type": "string"}])], "auto", "tools[0].function.parameters",
     "tools[0].function.parameters must be a JSON schema object"),
    ([fn(name="f", parameters={"type": "array"})], "auto", "tools[0].function.parameters",
     "tools[0].function.parameters must describe an object (its type is \"array\")"),
    (TOOLS, "any", "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or"),
    (TOOLS, {"type": "function"}, "tool_choice", "tool_choice must be"),
    (TOOLS, {"type": "function", "function": {"name": "get_news"}}, "tool_choice.function.name",
     "tool_choice.function.name \"get_news\" is not one of the tools (the tools are get_weather, get_time)"),
    (None, {"type": "function", "function": {"name": "get_news"}}, "tool_choice.function.name",
     "(no tools were sent)"),
    (None, "required", "tool_choice", "tool_choice \"required\" needs tools to call"),
    ([fn(name="f", parameters={"type": "object", "properties": {"p": {"type": "string", "format": "password"}}})],
     "required", "tools[0].function.parameters",
     "tools[0].function.parameters cannot be enforced (Unknown format: password)"),
])
def test_malformed_tools_and_tool_choice_name_their_field(tok, tools, choice, param, message):
    with pytest.raises(FieldError) as err:
        plan_tools(tools, choice, tok)
    assert err.value.param == param
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_schema_only_a_forced_call_needs_to_enforce_is_fine_under_auto(tok):
    tools = [fn(name="f", parameters={"type": "object", "properties": {"p": {"type": "string", "format": "password"}}})]
    assert plan_tools(tools, "auto", tok).parser is not None


def test_parallel_tool_calls_must_be_a_boolean(tok):
    with pytest.raises(FieldError, match="parallel_tool_calls must be true or false") as err:
        plan_tools(TOOLS, "auto", tok, parallel_tool_calls="no")
    assert err.value.param == "parallel_tool_calls"


# ---- forced calls: the grammar --------------------------------------------------------------------


def test_required_grammar_compiles_and_takes_one_or_more_calls_of_the_tools(tok):
    plan = plan_tools(TOOLS, "required", tok)
    assert plan.guide.kind == "lark"
    grammar = plan.guide.spec
    lltok = llguidance.LLTokenizer(tokenizer_json(tok))
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar), lltok) == ""
    time_call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    assert accepts(tok, grammar, weather())
    assert accepts(tok, grammar, time_call)
    assert accepts(tok, grammar, weather("Rome", "f") + "\n" + time_call)


@pytest.mark.parametrize("text", [
    weather().replace("get_weather", "get_news"),                       # not one of the tools
    weather().replace('"unit": "c"', '"unit": "k"'),                     # outside the enum
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',    # a required key missing
    weather().replace('"Paris"', "3"),                                   # the wrong type
    weather("Montevideo-1"),                                             # longer than maxLength
    weather().replace('"unit": "c"}', '"unit": "c", "x": 1}'),           # additionalProperties false
    "Sure! " + weather(),                                                # text before the call
    weather()[:-len("</tool_call>")],                                    # not closed
    "",                                                                   # no call at all
])
def test_required_grammar_refuses_what_is_not_a_valid_call(tok, text):
    assert not accepts(tok, plan_tools(TOOLS, "required", tok).guide.spec, text)


def test_a_named_function_forces_exactly_one_call_of_it(tok):
    grammar = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, tok).guide.spec
    assert accepts(tok, grammar, weather())
    assert not accepts(tok, grammar, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>')
    assert not accepts(tok, grammar, weather() + "\n" + weather())


def test_parallel_tool_calls_false_allows_one_call_only(tok):
    grammar = plan_tools(TOOLS, "required", tok, parallel_tool_calls=False).guide.spec
    assert accepts(tok, grammar, weather())
    assert not accepts(tok, grammar, weather() + "\n" + weather())
    # null is the default, as when the field is left out
    assert plan_tools(TOOLS, "required", tok, parallel_tool_calls=None) == plan_tools(TOOLS, "required", tok)


def test_a_tool_without_parameters_takes_any_arguments_object(tok):
    grammar = plan_tools([fn(name="ping")], "required", tok).guide.spec
    assert accepts(tok, grammar, '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')
    assert accepts(tok, grammar, '<tool_call>\n{"name": "ping", "arguments": {"a": [1, 2]}}\n</tool_call>')
    assert not accepts(tok, grammar, '<tool_call>\n{"name": "ping", "arguments": [1]}\n</tool_call>')


# ---- reading calls out of a reply ---------------------------------------------------------------


@pytest.fixture(scope="module")
def auto(tok):
    return plan_tools(TOOLS, "auto", tok)


def test_a_call_becomes_a_tool_call_with_its_own_id_and_no_content(auto):
    content, calls = parse_tool_calls(weather("Zürich"), auto)
    assert content is None and len(calls) == 1
    assert CALL_ID.fullmatch(calls[0].id) and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments_json) == {"city": "Zürich", "unit": "c"}
    assert "Zürich" in calls[0].arguments_json                 # not escaped to \u00fc
    assert calls[0].to_openai() == {"id": calls[0].id, "type": "function",
                                    "function": {"name": "get_weather", "arguments": calls[0].arguments_json}}


def test_text_around_calls_is_content_and_each_call_gets_a_distinct_id(auto):
    text = "Let me check.\n" + weather() + "\n" + weather("Rome") + "\nDone."
    content, calls = parse_tool_calls(text, auto)
    assert content == "Let me check.\nDone."
    assert [json.loads(c.arguments_json)["city"] for c in calls] == ["Paris", "Rome"]
    assert calls[0].id != calls[1].id


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>',
    '  <tool_call>\n\n   {"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}  \n\n</tool_call>\n',
    '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"c\\"}"}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',    # cut before its close
])
def test_calls_are_read_whatever_the_whitespace(auto, text):
    content, calls = parse_tool_calls(text, auto)
    assert content is None
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == [("get_weather", {"city": "Paris", "unit": "c"})]


@pytest.mark.parametrize("text", [
    weather().replace("get_weather", "get_news"),                            # not one of the tools
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',   # JSON that does not parse
    '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',        # arguments not an object
    '<tool_call>\n["get_weather"]\n</tool_call>',                             # not a call object
    '<tool_call>\n{"name": ["get_weather"], "arguments": {}}\n</tool_call>',   # a name that is not a string
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',        # cut mid-call
    "a <tool_call without its bracket",
    "Plain text with a <tool in it",
])
def test_what_is_not_a_call_of_a_tool_stays_content_as_written(auto, text):
    assert parse_tool_calls(text, auto) == (text, [])


def test_a_bad_block_between_good_calls_stays_content(auto):
    bad = weather().replace("get_weather", "get_news")
    content, calls = parse_tool_calls(weather() + "\n" + bad + "\n" + weather("Rome"), auto)
    assert content == bad and len(calls) == 2


def test_a_call_without_arguments_gets_an_empty_object(tok):
    plan = plan_tools([fn(name="ping")], "auto", tok)
    content, calls = parse_tool_calls('<tool_call>\n{"name": "ping"}\n</tool_call>', plan)
    assert content is None and calls[0].arguments_json == "{}"


def test_a_reply_without_calls_is_returned_unchanged(auto):
    for text in ("", "Hello\n", "\n  It is sunny.  \n"):
        assert parse_tool_calls(text, auto) == (text, [])


@pytest.mark.parametrize("text, content", [
    ("</tool_call>\nSure.", "Sure."),                           # a close with nothing before it
    ("Sure.</tool_call> Bye.", "Sure. Bye."),                    # the text on its sides joins with one space
    ("Sure.\n</tool_call>\nBye.", "Sure.\nBye."),
    ("Sure.\n</tool_call>", "Sure."),
    (weather() + "\n</tool_call>\nDone.", "Done."),              # a call closed twice
])
def test_a_close_with_no_call_open_is_dropped_whole_or_streamed(auto, text, content):
    whole, calls = parse_tool_calls(text, auto)
    assert whole == content and len(calls) == text.count("<tool_call>")
    for size in (1, 5):
        events = stream(auto, [text[i:i + size] for i in range(0, len(text), size)])
        assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == content


# ---- streaming ---------------------------------------------------------------------------------


STREAMED = [
    weather(),
    "Let me check.\n" + weather() + "\n" + weather("Rome") + "\nDone.",
    "Plain text with a <tool in it, and </tool_call> too.\n",
    weather().replace("get_weather", "get_news") + "\n" + weather(),
    "Checking: " + weather()[:-len("</tool_call>")],
    "Cut: <tool_call>\n{\"name\": \"get_weather\", \"argu",
]


def stream(plan: ToolPlan, pieces: list[str], cut_off: bool = False) -> list[ContentDelta | ToolCallDelta]:
    parser = ToolStreamParser(plan)
    events = [e for piece in pieces for e in parser.feed(piece)]
    return events + parser.finish(cut_off)


@pytest.mark.parametrize("text", STREAMED)
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_streamed_reply_reads_as_the_whole_reply_does(auto, text, size):
    events = stream(auto, [text[i:i + size] for i in range(0, len(text), size)])
    content, calls = parse_tool_calls(text, auto)
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == (content or "")
    streamed = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [e.index for e in streamed] == list(range(len(calls)))
    assert [(e.call.name, e.call.arguments_json) for e in streamed] == [(c.name, c.arguments_json) for c in calls]


NEWS = '<tool_call>\n{"name": "get_news", "arguments": {}}\n'
# replies that ended at max_tokens: (text, content, cities of the calls read)
CUT_OFF = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "", []),  # the only call, cut
    (weather() + '\n<tool_call>\n{"name": "get_w', None, ["Paris"]),              # a second call, cut
    (weather() + "\n<tool_call>", None, ["Paris"]),                               # cut right after its marker
    (weather() + "\n<tool_", None, ["Paris"]),                                    # cut inside its marker
    (weather()[:-len("_call>")], None, ["Paris"]),                                # whole, but its close cut
    ('Let me check.\n<tool_call>\n{"name', "Let me check.", []),                  # content stays, the call goes
    ("Plain text with a <tool", "Plain text with a <tool", []),                   # never a call: content
    ("Use <tool_call> to call, and", "Use <tool_call> to call, and", []),            # prose naming the marker
    (NEWS, NEWS, []),                                                             # whole, but not a tool's call
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": bad}} and', '<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": bad}} and', []),                                      # bad JSON, not a cut: content
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": tr', "", []),   # a literal cut
]


@pytest.mark.parametrize("text,content,cities", CUT_OFF)
@pytest.mark.parametrize("size", [1, 4, 1000])
def test_a_call_cut_off_by_max_tokens_is_dropped_streamed_or_whole(auto, text, content, cities, size):
    # half a call is markup, not an answer: it must not reach the client as content; a complete call
    # before it is kept, and text that only looks like markup stays content
    whole, calls = parse_tool_calls(text, auto, cut_off=True)
    assert (whole, [json.loads(c.arguments_json)["city"] for c in calls]) == (content, cities)
    events = stream(auto, [text[i:i + size] for i in range(0, len(text), size)], cut_off=True)
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == (content or "")
    assert [(e.index, e.call.name, e.call.arguments_json) for e in events if isinstance(e, ToolCallDelta)] == \
        [(i, c.name, c.arguments_json) for i, c in enumerate(calls)]


@pytest.mark.parametrize("stop_string, finish, content, calls", [
    (True, "stop", "", 0),                  # a stop string of the request cut the call: dropped, as at max_tokens
    (False, "stop", None, 0),               # the model ended there itself (stop strings given or not): content
    (False, "length", "", 0),
])
def test_a_call_a_stop_string_cut_is_dropped_not_sent_as_markup(auto, stop_string, finish, content, calls):
    from engine.server.chat import ChatView
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
    got, read = parse_tool_calls(text, auto, cut_off=ChatView._cut_off(finish, stop_string))
    assert got == (text if content is None else content) and len(read) == calls


def test_a_possible_call_start_is_held_back_until_it_is_known(auto):
    parser = ToolStreamParser(auto)
    assert parser.feed("Sure <tool") == [ContentDelta("Sure")]     # the space may separate text from a call
    assert parser.feed("bar") == [ContentDelta(" <toolbar")]          # it was not a call
    assert parser.feed(" and <tool_call>\n{\"name\": \"get_weather\", ") == [ContentDelta(" and")]
    assert parser.feed('"arguments": {"city": "Oslo", "unit": "c"}}\n</tool') == []
    [event] = parser.feed("_call>")
    assert isinstance(event, ToolCallDelta) and event.index == 0 and event.call.name == "get_weather"
    assert event.to_openai() == {"index": 0, "id": event.call.id, "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}
    assert parser.finish() == []


def test_without_a_parser_pieces_pass_through_untouched():
    parser = ToolStreamParser(ToolPlan())
    assert parser.feed("<tool_call>") == [ContentDelta("<tool_call>")]
    assert parser.feed("") == [] and parser.finish() == []


# ---- the Mistral syntax -------------------------------------------------------------------------


MISTRAL_TEMPLATE = ("{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                    "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
                    "{% elif m.tool_calls %}[TOOL_CALLS] {{ m.tool_calls | map(attribute='function') | list | tojson }}"
                    "{% else %}{{ m.content }}{% endif %}{% endfor %}")
MISTRAL_CALLS = ' [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, ' \
                '{"name": "get_time", "arguments": {"zone": "utc"}}]'


def test_mistral_calls_are_read_and_forced_with_a_text_marker(tmp_path):
    tokenizer = tokenizer_with(tmp_path, MISTRAL_TEMPLATE)
    plan = plan_tools(TOOLS, "auto", tokenizer)
    assert plan.parser.syntax == MISTRAL
    content, calls = parse_tool_calls("[TOOL_CALLS]" + MISTRAL_CALLS, plan)
    assert content is None and [c.name for c in calls] == ["get_weather", "get_time"]
    assert all(re.fullmatch(r"[0-9a-f]{9}", c.id) for c in calls)      # Mistral templates insist on 9 characters
    grammar = plan_tools(TOOLS, "required", tokenizer).guide.spec
    assert accepts(tokenizer, grammar, "[TOOL_CALLS]" + MISTRAL_CALLS)
    assert not accepts(tokenizer, grammar, "[TOOL_CALLS]" + MISTRAL_CALLS.replace("get_time", "get_news"))
    assert parse_tool_calls("[TOOL_CALLS] [1, 2]", plan) == ("[TOOL_CALLS] [1, 2]", [])
    cut = "[TOOL_CALLS]" + MISTRAL_CALLS[:-12]                 # the list's second call cut by max_tokens
    assert parse_tool_calls(cut, plan) == (cut, [])
    content, calls = parse_tool_calls(cut, plan, cut_off=True)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    assert parse_tool_calls("[TOOL_CALLS] [", plan, cut_off=True) == ("", [])
    assert parse_tool_calls("[TOOL_CALLS] [1, 2", plan, cut_off=True) == ("[TOOL_CALLS] [1, 2", [])


def test_mistral_calls_are_read_when_decoding_drops_a_special_marker(tmp_path):
    tokenizer = tokenizer_with(tmp_path, MISTRAL_TEMPLATE, special_marker="[TOOL_CALLS]")
    marker_id = tokenizer.encode("[TOOL_CALLS]", add_special_tokens=False)
    assert len(marker_id) == 1 and tokenizer.decode(marker_id) == ""
    plan = plan_tools(TOOLS, "auto", tokenizer)
    assert plan.parser.syntax.marker_token == marker_id[0]
    content, calls = parse_tool_calls(MISTRAL_CALLS, plan)         # the reply as decoded: no marker
    assert content is None and len(calls) == 2
    assert parse_tool_calls("[1] is a citation, not a call.", plan) == ("[1] is a citation, not a call.", [])
    assert parse_tool_calls("[1] is a citation, no", plan, cut_off=True) == ("[1] is a citation, no", [])
    content, calls = parse_tool_calls(MISTRAL_CALLS[:-12], plan, cut_off=True)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    grammar = plan_tools(TOOLS, "required", tokenizer).guide.spec
    assert f"<[{marker_id[0]}]>" in grammar                         # the special token, not its spelling
    assert accepts(tokenizer, grammar, MISTRAL_CALLS, prefix_ids=tuple(marker_id))
    assert not accepts(tokenizer, grammar, MISTRAL_CALLS)


# ---- messages ------------------------------------------------------------------------------------


def test_messages_are_rendered_as_templates_expect(tok):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}],
         "name": "ana"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    rendered = render_messages(messages)
    assert rendered == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in\nParis?", "name": "ana"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    prompt = tok.apply_chat_template(rendered, **plan_tools(TOOLS, "auto", tok).template_vars)
    assert weather() in prompt and "<tool_response>\nsunny\n</tool_response>" in prompt
    assert prompt.startswith("<|im_start|>system\nBe brief.")


ASSISTANT_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize("messages,param,message", [
    ({"role": "user", "content": "hi"}, "messages", "messages must be a non-empty list"),
    ([], "messages", "(got an empty list)"),
    ([{"role": "user", "content": "hi"}, "hi"], "messages[1]", "messages[1] must be an object"),
    ([{"content": "hi"}], "messages[0].role", "messages[0].role is missing; give each message a role: system, "
                                              "developer, user, assistant, tool"),
    ([{"role": "bot", "content": "hi"}], "messages[0].role", "messages[0].role must be one of system, developer, "
                                                             "user, assistant, tool (got \"bot\")"),
    ([{"role": 7, "content": "hi"}], "messages[0].role", "(got 7)"),
    ([{"role": "user"}], "messages[0].content", "messages[0].content is missing"),
    ([{"role": "user", "content": 42}], "messages[0].content",
     "messages[0].content must be a string or a list of {\"type\": \"text\", \"text\": ...} parts (got a number)"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0].type",
     "messages[0].content[0] has type \"image_url\", but this model reads text only"),
    ([{"role": "user", "content": [{"text": "hi"}]}], "messages[0].content[0].type", "must be \"text\" (got null)"),
    ([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}], "messages[0].content[0].type",
     "must be \"text\" (or \"refusal\" in an assistant's message) (got \"refusal\")"),
    ([{"role": "assistant", "content": [{"type": "refusal", "refusal": 3}]}], "messages[0].content[0].refusal",
     "messages[0].content[0].refusal must be a string (got a number)"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content[0].text", "must be a string"),
    ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]", "messages[0].content[0] must be an object"),
    ([{"role": "user", "content": "hi", "name": 5}], "messages[0].name", "messages[0].name must be a string"),
    ([{"role": "assistant", "tool_calls": {"id": "c1"}}], "messages[0].tool_calls", "must be a list of calls"),
    ([{"role": "assistant", "tool_calls": [{**ASSISTANT_CALL, "id": None}]}], "messages[0].tool_calls[0].id",
     "messages[0].tool_calls[0].id must be the call's id as a string"),
    ([{"role": "assistant", "tool_calls": [{**ASSISTANT_CALL, "function": "f"}]}],
     "messages[0].tool_calls[0].function", "must be an object with a name and arguments (got a string)"),
    ([{"role": "assistant", "tool_calls": [{**ASSISTANT_CALL, "function": {"arguments": "{}"}}]}],
     "messages[0].tool_calls[0].function.name", "must be the called tool's name"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        ASSISTANT_CALL, {**ASSISTANT_CALL, "function": {"name": "f", "arguments": "{'city': 'Paris'}"}}]}],
     "messages[1].tool_calls[1].function.arguments",
     "messages[1].tool_calls[1].function.arguments is not valid JSON (Expecting property name enclosed in double "
     "quotes at character 1)"),
    ([{"role": "assistant", "tool_calls": [{**ASSISTANT_CALL, "function": {"name": "f", "arguments": "[1]"}}]}],
     "messages[0].tool_calls[0].function.arguments", "must encode a JSON object (got a list)"),
    ([{"role": "assistant", "tool_calls": [{**ASSISTANT_CALL, "function": {"name": "f", "arguments": 1}}]}],
     "messages[0].tool_calls[0].function.arguments", "must be a JSON object encoded as a string (got a number)"),
    ([{"role": "tool", "content": "sunny"}], "messages[0].tool_call_id",
     "messages[0].tool_call_id must be the id of the call this result answers (got null)"),
])
def test_malformed_messages_name_their_field(messages, param, message):
    with pytest.raises(FieldError) as err:
        render_messages(messages)
    assert err.value.param == param
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_assistant_turn_a_client_hands_back_as_a_refusal_part_reads_as_its_text():
    # OpenAI's history form of a refused reply: a client that keeps it and sends it back is answered
    out = render_messages([{"role": "user", "content": "x"},
                           {"role": "assistant",
                            "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
                           {"role": "user", "content": "y"}])
    assert out[1] == {"role": "assistant", "content": "I can't help with that."}


# ---- through the engine: a tiny random model, greedy, under the guide ------------------------------------


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    return build_tiny_tools_model(tmp_path_factory.mktemp("tools_model") / "m")


@pytest.fixture(scope="module")
def llm(tools_model):
    with LLM(str(tools_model), device="cpu") as model:
        yield model


def test_markers_that_are_one_token_are_forced_as_that_token(tools_model):
    # The grammar library holds an added "<...>" token apart from the text it spells: a grammar that
    # spelled "<tool_call>" as text would refuse the very token the model writes it with.
    tokenizer = Tokenizer.from_dir(tools_model)
    _TOKENIZER_JSON[id(tokenizer)] = (tools_model / "tokenizer.json").read_text(encoding="utf-8")
    open_id, close_id = (tokenizer.token_to_id(t) for t in ("<tool_call>", "</tool_call>"))
    syntax = plan_tools(TOOLS, "auto", tokenizer).parser.syntax
    assert (syntax.marker_token, syntax.close_token, syntax.marker_hidden) == (open_id, close_id, False)
    grammar = plan_tools(TOOLS, "required", tokenizer).guide.spec
    assert f"<[{open_id}]>" in grammar and f"<[{close_id}]>" in grammar
    ids = tokenizer.encode(weather(), add_special_tokens=False)
    assert ids[0] == open_id and ids[-1] == close_id
    assert accepts(tokenizer, grammar, weather())


@pytest.mark.parametrize("choice,parallel", [({"type": "function", "function": {"name": "get_weather"}}, True),
                                             ("required", False)])
def test_a_forced_reply_of_a_random_model_parses_into_valid_calls(llm, choice, parallel):
    plan = plan_tools(TOOLS, choice, llm.tokenizer, parallel_tool_calls=parallel)
    messages = render_messages([{"role": "user", "content": "What is the weather in Paris?"}])
    prompt = llm.tokenizer.apply_chat_template(messages, **plan.template_vars)
    out = llm.generate(prompt, SamplingParams(guide=plan.guide, temperature=0, max_tokens=160))[0]
    assert out.finish_reason == "stop", out.text          # the grammar was complete before max_tokens
    content, calls = parse_tool_calls(out.text, plan)
    assert content is None and len(calls) == 1, out.text
    assert calls[0].name in {"get_weather", "get_time"}
    if isinstance(choice, dict):
        assert calls[0].name == "get_weather"
    assert follows(calls[0].name, json.loads(calls[0].arguments_json)), calls[0].arguments_json
