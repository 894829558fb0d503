"""A model folder's chat template that fails, each way it can: one that does not parse, one that refuses a
message through raise_exception, one that fails on its own. Each names the file it came from and the template's
line and words; a refusal names the role of the message it refused, which is what a front end's fix depends on,
and only when that message's removal lets the conversation through; finding it takes a few renders however long
the conversation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.chat_template import (ChatTemplate, ChatTemplateFault, ChatTemplateRefusal, TemplateFixes,
                                  TemplateOrigin, failure_line)
from engine.errors import StrataError
from engine.tokenizer import Tokenizer
from tests.engine.tokenizer_fixtures import CHAT_TEMPLATE, build_tiny_tokenizer

TURNS = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
NO_SYSTEM = ("{%- for m in messages %}{%- if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
             "{%- endif %}{%- endfor %}" + TURNS)
# Mistral's check, after its system message is taken out
ALTERNATE = ("{%- set loop_messages = messages[1:] if messages[0].role == 'system' else messages %}"
             "{%- for m in loop_messages %}{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
             "{%- endif %}{%- endfor %}" + TURNS)
LAST_FROM_USER = ("{%- if messages[-1].role != 'user' %}{{ raise_exception('The last message must be from the user') }}"
                  "{%- endif %}" + TURNS)
FIRST_FROM_USER = ("{%- if messages[0].role != 'user' %}{{ raise_exception('Start with a user message') }}{%- endif %}"
                   + TURNS)
AT_MOST_4 = "{%- if messages | length > 4 %}{{ raise_exception('At most 4 messages') }}{%- endif %}" + TURNS
NEEDS_TOOLS = "{%- if not tools %}{{ raise_exception('This model needs tools') }}{%- endif %}" + TURNS
UNKNOWN_ROLE = ("{%- for m in messages %}{%- if m.role not in ['user', 'assistant'] %}"
                "{{ raise_exception('Unknown role: ' + m.role) }}{%- endif %}{%- endfor %}" + TURNS)
SYSTEM, USER, ASSISTANT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello"})
TOOL = {"role": "tool", "content": "ok"}
TOOL_TURN = [USER, {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


def _tokenizer(folder: Path, template: str, as_file: bool = False) -> Tokenizer:
    """The tiny tokenizer with ``template`` in tokenizer_config.json, or in chat_template.jinja (``as_file``)."""
    build_tiny_tokenizer(folder, chat_template=None if as_file else template)
    if as_file:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return Tokenizer.from_dir(folder)


def _failure(tok: Tokenizer, messages: list[dict]) -> StrataError:
    with pytest.raises(StrataError) as err:
        tok.apply_chat_template(messages)
    assert "\n" not in str(err.value)
    return err.value


def test_a_template_file_that_fails_on_its_own_names_the_file_and_the_line(tmp_path):
    tok = _tokenizer(tmp_path, "{#- a greeting first -#}\n{{ bos_token }}\n{{ persona.greeting }}\n" + TURNS,
                     as_file=True)
    err = _failure(tok, [USER])
    assert isinstance(err, ChatTemplateFault)
    assert (err.cause, err.line) == ("'persona' is undefined", 3)
    assert err.origin == TemplateOrigin(tmp_path / "chat_template.jinja")
    assert str(err) == (f"the model folder's chat template failed at line 3 of {tmp_path / 'chat_template.jinja'} "
                        "('persona' is undefined); fix the template there")


@pytest.mark.parametrize("template, cause", [
    ("{{ 1 // 0 }}", "integer division or modulo by zero"),          # a ZeroDivisionError
    ("{{ range(10 ** 9) | list }}", "Range too big."),                  # the sandbox's OverflowError
    ("{{ messages[0].content.split(1) }}", "must be str or None, not int"),        # a TypeError in a method
])
def test_whatever_a_template_raises_is_its_fault_in_one_line_not_a_crash(tmp_path, template, cause):
    err = _failure(_tokenizer(tmp_path, template + TURNS), [USER])
    assert isinstance(err, ChatTemplateFault) and cause in err.cause and err.line == 1
    origin = f"chat_template in {tmp_path / 'tokenizer_config.json'}"
    assert str(err).startswith(f"the model folder's chat template failed at line 1 of {origin} (")


@pytest.mark.parametrize("template, messages, role", [
    (NO_SYSTEM, [SYSTEM, USER], "system"),
    (ALTERNATE, [SYSTEM, USER, USER], "user"),                  # two user turns in a row: the second is refused
    (CHAT_TEMPLATE, TOOL_TURN, "tool"),                         # a template that knows no tool role
    (LAST_FROM_USER, [USER, ASSISTANT], "assistant"),           # refused only as the conversation's end
    (LAST_FROM_USER, [SYSTEM, USER, ASSISTANT], "assistant"),   # its first message alone is refused too, not blamed
    (FIRST_FROM_USER, [SYSTEM, USER], "system"),                # the conversation without it gets through
    # the first prefix refused ends at the assistant message, but the conversation is refused for its end
    (LAST_FROM_USER, [USER, ASSISTANT, USER, TOOL], "tool"),
    (LAST_FROM_USER, [USER, SYSTEM, USER, ASSISTANT], "assistant"),     # not the system message: it is no cause
])
def test_a_refusal_names_the_role_of_the_message_it_refused(tmp_path, template, messages, role):
    err = _failure(_tokenizer(tmp_path, template), messages)
    assert isinstance(err, ChatTemplateRefusal) and err.role == role and err.line == 1
    article = "an" if role == "assistant" else "a"
    assert str(err).startswith(f"the model folder's chat template refused {article} {role} message at line 1 of "
                               f"chat_template in {tmp_path / 'tokenizer_config.json'} ({err.cause}); ")


def test_a_refusal_of_the_conversations_length_blames_no_message_in_it():
    tick = Renders()
    with pytest.raises(ChatTemplateRefusal) as err:
        ChatTemplate("{{ tick() }}" + AT_MOST_4).render([SYSTEM] + [USER, ASSISTANT] * 2 + [USER], True,
                                                       {"tick": tick})
    assert err.value.role is None    # its fifth message turns an accepted prefix into a refused one: not the cause
    assert str(err.value).endswith("(At most 4 messages); give the conversation what the template's words ask "
                                   "for, or fix the template there")
    assert tick.count == 1 + 3 + 3   # 3 halvings of 6 prefixes; without the fifth, the first, the last


def test_a_system_message_that_is_no_cause_is_not_the_one_to_drop(tmp_path):
    fixes = TemplateFixes(fault="FAULT", system="DROP THE SYSTEM PROMPT", other="START OVER", conversation="TOOLS")
    err = _failure(_tokenizer(tmp_path, LAST_FROM_USER), [USER, SYSTEM, USER, ASSISTANT])
    assert failure_line(err, fixes).endswith("(The last message must be from the user); START OVER")


@pytest.mark.parametrize("messages", [[SYSTEM, USER], [USER], [SYSTEM, USER, ASSISTANT, USER]])
def test_a_refusal_no_one_message_causes_is_of_the_conversation_not_its_first_message(tmp_path, messages):
    err = _failure(_tokenizer(tmp_path, NEEDS_TOOLS), messages)
    assert isinstance(err, ChatTemplateRefusal) and err.role is None
    assert str(err) == (f"the model folder's chat template refused the conversation at line 1 of chat_template in "
                        f"{tmp_path / 'tokenizer_config.json'} (This model needs tools); give the conversation what "
                        "the template's words ask for, or fix the template there")


class Renders:
    """A template variable a template calls once per render: how many renders a failure cost."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return ""


@pytest.mark.parametrize("n, at, renders", [
    (4096, 4095, 1 + 12 + 1),       # the render that failed, 12 halvings of the prefixes, then without the one found
    (4096, 2000, 1 + 12 + 1),
    (4096, 1, 1 + 12 + 1),
    (100_000, 99_999, 1 + 1),       # past 4096 messages only the last is tried: each render is the whole of it
])
def test_finding_the_refused_message_takes_a_few_renders_however_long_the_conversation(n, at, renders):
    template = ChatTemplate("{{ tick() }}" + ALTERNATE)
    messages = [USER if i % 2 == 0 else ASSISTANT for i in range(n - 1)]
    messages.insert(at, messages[at - 1])                       # two of one role in a row: the second is refused
    tick = Renders()
    with pytest.raises(ChatTemplateRefusal) as err:
        template.render(messages, True, {"tick": tick})
    assert err.value.role == messages[at]["role"] and tick.count == renders


def test_a_refusal_of_every_prefix_costs_two_renders_more_to_tell_it_is_of_the_conversation():
    tick = Renders()
    with pytest.raises(ChatTemplateRefusal) as err:
        ChatTemplate("{{ tick() }}" + NEEDS_TOOLS).render([SYSTEM] + [USER, ASSISTANT] * 2047 + [USER], True,
                                                          {"tick": tick})
    assert err.value.role is None and tick.count == 1 + 12 + 2     # without the first, then without the last


def test_a_long_conversation_refused_before_its_end_is_refused_as_a_whole():
    messages = [USER if i % 2 == 0 else ASSISTANT for i in range(10_000)]
    messages[5000] = ASSISTANT
    tick = Renders()
    with pytest.raises(ChatTemplateRefusal) as err:
        ChatTemplate("{{ tick() }}" + ALTERNATE).render(messages, True, {"tick": tick})
    assert err.value.role is None and tick.count == 2


def test_a_role_and_words_from_the_caller_stay_one_short_line():
    err = _refusal(UNKNOWN_ROLE, [USER, {"role": "tool\nX-Injected: 1", "content": "ok"}])
    assert err.role == "tool\nX-Injected: 1"
    assert str(err).startswith("the model folder's chat template refused a tool\\nX-Injected: 1 message at its "
                               "line 1 (Unknown role: tool\\nX-Injected: 1); ")
    err = _refusal(UNKNOWN_ROLE, [USER, {"role": "r" * 5000, "content": "ok"}])
    assert "\n" not in str(err) and len(str(err)) < 600 and f"refused a {'r' * 37}... message" in str(err)


def _refusal(template: str, messages: list[dict]) -> ChatTemplateRefusal:
    with pytest.raises(ChatTemplateRefusal) as err:
        ChatTemplate(template).render(messages, True, {})
    return err.value


def test_each_front_end_words_its_own_fix_and_a_client_is_not_shown_the_files(tmp_path):
    fixes = TemplateFixes(fault="FAULT", system="DROP THE SYSTEM PROMPT", other="START OVER", conversation="TOOLS")
    refusal = _failure(_tokenizer(tmp_path / "a", NO_SYSTEM), [SYSTEM, USER])
    assert failure_line(refusal, fixes).endswith("(System role not supported); DROP THE SYSTEM PROMPT")
    alternate = _failure(_tokenizer(tmp_path / "b", ALTERNATE), [USER, USER])
    assert failure_line(alternate, fixes).endswith("; START OVER")
    whole = _failure(_tokenizer(tmp_path / "d", NEEDS_TOOLS), [SYSTEM, USER])
    assert failure_line(whole, fixes).endswith("(This model needs tools); TOOLS")
    fault = _failure(_tokenizer(tmp_path / "c", "{{ persona }}{{ persona.x }}"), [USER])
    assert failure_line(fault, fixes, show_files=False) == ("the model's chat template failed at its line 1 "
                                                            "('persona' is undefined); FAULT")


def test_a_template_file_that_does_not_parse_names_the_file_and_the_line(tmp_path):
    tok = _tokenizer(tmp_path, "{%- for m in messages %}\n{{ m.content }}\n{%- endfor\n", as_file=True)
    assert not tok.has_chat_template and tok.encode("hi")
    assert tok.template_error.line == 3
    assert tok.template_problem.startswith(f"the model folder's chat template does not parse at line 3 of "
                                           f"{tmp_path / 'chat_template.jinja'} (unexpected end of template")


def test_a_template_picked_from_a_list_of_named_templates_names_the_config_file(tmp_path):
    build_tiny_tokenizer(tmp_path, chat_template=None)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["chat_template"] = [{"name": "tool_use", "template": TURNS}, {"name": "default", "template": "{{ x.y }}"}]
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    err = _failure(Tokenizer.from_dir(tmp_path), [USER])
    assert isinstance(err, ChatTemplateFault) and err.origin == TemplateOrigin(cfg_path, "chat_template")
