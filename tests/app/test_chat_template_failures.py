"""The window on a model folder whose chat template fails: the reply says so in one line naming the template's
file, line and words and a fix that works in the window; the message typed stays, the window stays usable,
and a template that does not parse is not called missing."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.messages import GenerationSettings
from tests.app.conftest import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS
from tiny_models import build_tiny_model

TURNS = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
REOPEN = "fix the template there and open the folder again with File › Open model folder…"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("chat") / "m", "qwen3_moe")


def _with_template(chat_model: Path, folder: Path, template: str) -> Path:
    shutil.copytree(chat_model, folder)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder


def _send(window, qtbot, text: str):
    """Type ``text`` and press Send; the reply's stats once it ends."""
    window.chat_pane.settings_box.set_settings(GenerationSettings(temperature=0.0, top_p=1.0, top_k=0, max_tokens=4))
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        window.chat_pane.input.setPlainText(text)
        window.chat_pane.send_button.click()
    return done.args[0]


def test_a_template_that_fails_on_its_own_says_so_in_the_reply_and_keeps_the_message(window_factory, qtbot,
                                                                                     chat_model, tmp_path):
    model = _with_template(chat_model, tmp_path / "m", "{{ bos_token }}\n{{ persona.greeting }}\n" + TURNS)
    window = window_factory(model=str(model))
    stats = _send(window, qtbot, "Hello there")
    assert stats.error == (f"the model folder's chat template failed at line 2 of {model / 'chat_template.jinja'} "
                           f"('persona' is undefined); {REOPEN}")
    assert stats.error in window.chat_pane.view.bubbles[-1].stats.text()
    assert [(m.role, m.content) for m in window.chat.current.messages] == [("user", "Hello there"), ("assistant", "")]
    assert window.chat_pane.view.bubbles[0].text == "Hello there"
    assert window.chat_pane.send_button.isEnabled() and not window.chat_pane.stop_button.isEnabled()


def test_a_template_that_refuses_the_system_prompt_says_to_clear_it_and_that_works(window_factory, qtbot,
                                                                                   chat_model, tmp_path):
    refuses = ("{%- if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
               + TURNS)
    model = _with_template(chat_model, tmp_path / "m", refuses)
    window = window_factory(model=str(model))
    window.chat_pane.settings_box.system_prompt.setPlainText("Be brief.")
    stats = _send(window, qtbot, "Hello there")
    assert stats.error == (f"the model folder's chat template refused a system message at line 1 of "
                           f"{model / 'chat_template.jinja'} (System role not supported); clear System under System "
                           "prompt and sampling, then press Regenerate")
    window.chat_pane.settings_box.system_prompt.setPlainText("")        # the fix it names
    assert window.chat_pane.regen_button.isEnabled()
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        window.chat_pane.regen_button.click()
    assert done.args[0].error is None and done.args[0].completion_tokens > 0
    assert window.chat.current.messages[0].content == "Hello there"


def test_a_template_that_refuses_whatever_the_chat_says_to_fix_it_not_to_clear_system(window_factory, qtbot,
                                                                                       chat_model, tmp_path):
    needs_tools = "{%- if not tools %}{{ raise_exception('This model needs tools') }}{%- endif %}" + TURNS
    model = _with_template(chat_model, tmp_path / "m", needs_tools)
    window = window_factory(model=str(model))
    window.chat_pane.settings_box.system_prompt.setPlainText("Be brief.")   # its first message: not to blame
    stats = _send(window, qtbot, "Hello there")
    assert stats.error == (f"the model folder's chat template refused the conversation at line 1 of "
                           f"{model / 'chat_template.jinja'} (This model needs tools); {REOPEN}")
    (model / "chat_template.jinja").write_text(TURNS, encoding="utf-8")     # the fix it names
    with qtbot.waitSignal(window.model_ready, timeout=LOAD_TIMEOUT_MS):
        window.open_model(str(model))
    assert window.chat_pane.regen_button.isEnabled()
    with qtbot.waitSignal(window.chat.reply_done, timeout=REPLY_TIMEOUT_MS) as done:
        window.chat_pane.regen_button.click()
    assert done.args[0].error is None and done.args[0].completion_tokens > 0


def test_a_template_that_does_not_parse_is_called_broken_not_missing(window_factory, chat_model, tmp_path):
    model = _with_template(chat_model, tmp_path / "m", "{%- for m in messages %}\n{{ m.content }\n")
    window = window_factory(model=str(model))
    label = window.chat_pane.mode_label.text()
    assert label.startswith("Completion mode: this model has a broken chat template (see the note)")
    assert any(note.startswith(f"the model folder's chat template does not parse at line 2 of "
                               f"{model / 'chat_template.jinja'}") for note in window.model.notes)
