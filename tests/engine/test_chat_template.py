"""A model folder's chat template that fails, each way it can: one that does not parse, one that refuses a
message through raise_exception, one that fails on its own. Each names the file it came from and the template's
line and words; a refusal names the role of the message it refused, which is what a front end's fix depends on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.chat_template import (ChatTemplateFault, ChatTemplateRefusal, TemplateFixes, TemplateOrigin,
                                  failure_line)
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
SYSTEM, USER, ASSISTANT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello"})
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
])
def test_a_refusal_names_the_role_of_the_message_it_refused(tmp_path, template, messages, role):
    err = _failure(_tokenizer(tmp_path, template), messages)
    assert isinstance(err, ChatTemplateRefusal) and err.role == role and err.line == 1
    article = "an" if role == "assistant" else "a"
    assert str(err).startswith(f"the model folder's chat template refused {article} {role} message at line 1 of "
                               f"chat_template in {tmp_path / 'tokenizer_config.json'} ({err.cause}); ")


def test_each_front_end_words_its_own_fix_and_a_client_is_not_shown_the_files(tmp_path):
    fixes = TemplateFixes(fault="FAULT", system="DROP THE SYSTEM PROMPT", other="START OVER")
    refusal = _failure(_tokenizer(tmp_path / "a", NO_SYSTEM), [SYSTEM, USER])
    assert failure_line(refusal, fixes).endswith("(System role not supported); DROP THE SYSTEM PROMPT")
    alternate = _failure(_tokenizer(tmp_path / "b", ALTERNATE), [USER, USER])
    assert failure_line(alternate, fixes).endswith("; START OVER")
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
