"""What a chat template is given and how its failures are told: a tool sent without parameters (OpenAI allows
it) reaches the template with an empty parameters object, a template that refuses the conversation itself
(raise_exception) is blamed on the messages, or where no one message is to blame on a rule its words state, and one
that fails on its own or does not parse is named as the template's fault, at the template's line and without the
server's files. The template's words stay one line, whatever of the request they quote."""
from __future__ import annotations

import pytest

from engine.server import chat
from engine.server.engine_client import ModelInfo
from engine.server.errors import APIError
from engine.chat_template import ChatTemplateFault
from engine.tokenizer import Tokenizer
from tests.engine.tokenizer_fixtures import CHAT_TEMPLATE, build_tiny_tokenizer

TURNS = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
# as Llama's and Mistral's templates do: each tool's parameters written with tojson, unchecked
PARAMETERS_TEMPLATE = ("{%- for t in tools or [] %}{{ t.function.name + ': ' + (t.function.parameters | tojson) }}"
                       "{{ ' (call it with <tool_call>)\\n' }}{%- endfor %}" + TURNS)
# a template reading a variable it expects its caller to set
VARIABLE_TEMPLATE = "{{ persona.greeting | tojson }}" + TURNS
HI = [{"role": "user", "content": "Hi"}]


def _info(folder, template: str) -> ModelInfo:
    build_tiny_tokenizer(folder, vocab_size=512, chat_template=template)
    return ModelInfo("m", str(folder), Tokenizer.from_dir(folder), context_tokens=4096, vocab_size=512, max_batch=4,
                     created=0)


def _refusal(body: dict, info: ModelInfo) -> dict:
    with pytest.raises(APIError) as err:
        chat.prepare(body, info)
    assert err.value.status == 400 and "\n" not in err.value.message
    return {"message": err.value.message, "param": err.value.param, "code": err.value.code}


def test_a_tool_without_parameters_reaches_the_template_as_taking_an_empty_object(tmp_path):
    info = _info(tmp_path, PARAMETERS_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "now"}},
             {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
                 "a": {"type": "integer"}}}}}]
    prompt = info.tokenizer.decode(chat.prepare({"messages": HI, "tools": tools}, info).ids, skip_special_tokens=False)
    assert 'now: {"type": "object", "properties": {}} (call it' in prompt
    assert 'add: {"type": "object", "properties": {"a": {"type": "integer"}}} (call it' in prompt


def test_a_template_that_fails_on_its_own_is_named_as_the_fault_not_the_messages(tmp_path):
    error = _refusal({"messages": HI}, _info(tmp_path, VARIABLE_TEMPLATE))
    assert error["param"] is None and error["code"] == "chat_template_error"
    assert error["message"] == ("the model's chat template failed at its line 1 ('persona' is undefined); the fault "
                                "is the template's rather than the messages'; whoever serves the model can fix its "
                                "chat_template")
    assert str(tmp_path) not in error["message"]           # a client is not shown the server's folders


def test_a_template_failure_with_template_variables_set_points_at_them(tmp_path):
    error = _refusal({"messages": HI, "chat_template_kwargs": {"persona": {"name": "x"}}},
                     _info(tmp_path, VARIABLE_TEMPLATE))
    assert error["param"] == "chat_template_kwargs" and error["code"] == "chat_template_error"
    assert "check the variables chat_template_kwargs sets" in error["message"]


def test_a_template_that_refuses_the_conversation_is_blamed_on_the_messages(tmp_path):
    # the demo's template knows no tool role, and says so with raise_exception
    messages = HI + [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    error = _refusal({"messages": messages}, _info(tmp_path, CHAT_TEMPLATE))
    assert error["param"] == "messages" and error["code"] is None
    assert error["message"] == ("the model's chat template refused a tool message at its line 1 (Unknown role: tool); "
                                "change the messages to the roles and order this model expects")


def test_the_tokenizer_tells_a_templates_own_failure_from_its_refusal(tmp_path):
    tok = _info(tmp_path, VARIABLE_TEMPLATE).tokenizer
    with pytest.raises(ChatTemplateFault) as err:
        tok.apply_chat_template(HI)
    assert err.value.cause == "'persona' is undefined"


def test_a_template_that_does_not_parse_is_named_as_the_fault_and_plain_prompts_offered(tmp_path):
    error = _refusal({"messages": HI}, _info(tmp_path, "{% for m in messages %}{{ m.content }"))
    assert error["param"] is None and error["code"] == "chat_template_error"
    assert error["message"] == ("the model's chat template does not parse at its line 1 (unexpected '}'); send a plain "
                                "prompt to /v1/completions until whoever serves the model fixes its chat_template")


def test_whatever_the_template_raises_is_a_400_naming_it_not_a_500(tmp_path):
    error = _refusal({"messages": HI}, _info(tmp_path, "{{ 1 // 0 }}" + TURNS))
    assert error["code"] == "chat_template_error"
    assert error["message"].startswith("the model's chat template failed at its line 1 (integer division or modulo "
                                       "by zero); the fault is the template's")


def test_a_refusal_no_one_message_causes_names_the_rule_and_meeting_it_works(tmp_path):
    info = _info(tmp_path, "{%- if not tools %}{{ raise_exception('This model needs tools') }}{%- endif %}"
                 + PARAMETERS_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}] + HI
    error = _refusal({"messages": messages}, info)
    assert error["param"] is None and error["code"] is None       # the rule may be about another field
    assert error["message"] == ("the model's chat template refused the conversation at its line 1 (This model needs "
                                "tools); change the request to meet the rule in the template's own words, or whoever "
                                "serves the model can change its chat_template")
    tools = [{"type": "function", "function": {"name": "now"}}]
    assert chat.prepare({"messages": messages, "tools": tools}, info).ids        # the fix it names


def test_a_templates_words_quoting_the_request_stay_one_line(tmp_path):
    quotes = ("{%- for m in messages %}{%- if m.content.startswith('!') %}{{ raise_exception('Bad message: ' "
              "+ m.content) }}{%- endif %}{%- endfor %}" + TURNS)
    error = _refusal({"messages": [{"role": "user", "content": "!hi\r\nX-Injected: 1" + "x" * 5000}]},
                     _info(tmp_path, quotes))
    assert error["message"].startswith("the model's chat template refused a user message at its line 1 (Bad message: "
                                       "!hi\\r\\nX-Injected: 1xxx")
    assert "\r" not in error["message"] and len(error["message"]) < 600
