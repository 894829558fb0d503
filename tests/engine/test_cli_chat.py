"""``chat`` in the terminal: no input ends the session but /exit, /quit, end of input or Ctrl-C twice,
a conversation that outgrows the context follows the overflow policy, /save keeps the transcript, and a model
folder's chat template that fails is one line naming its file and line, whose fix works."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import engine.engine as engine_mod
from engine.cli.chat import QUIT_HINT
from engine.errors import DeviceOutOfMemoryError
from main import main
from tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "models" / "demo"
# About 25 tokens with the demo tokenizer: 20 of these lines are far more than its 512-token context,
# and the turn tests load it with a 128-token context to keep each prefill short.
SHORT_CONTEXT = ("--max-model-len", "128")
LONG_LINE = "And it came to pass in the days of the king that the people went up to the city, turn {}"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny model with a chat template (the demo model is a base model: completion mode)."""
    return build_tiny_model(tmp_path_factory.mktemp("chat") / "m", "qwen3_moe")


def run_chat(monkeypatch, capsys, lines, *flags, model=DEMO):
    """Run ``main chat`` in-process with ``lines`` as typed input (an exception class is raised instead)."""
    feed = iter(lines)

    def typed(prompt=""):
        item = next(feed, EOFError)
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item
        return item
    monkeypatch.setattr("builtins.input", typed)
    rc = main(["chat", "--model", str(model), "--device", "cpu", "--max-tokens", "4", "--temperature", "0", *flags])
    out, err = capsys.readouterr()
    return rc, out, err, list(feed)


def saved(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["messages"]


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


# ---- the real command, stdin fed by a pipe -----------------------------------------------------------

def test_the_real_cli_survives_empty_lines_and_bytes_that_are_not_text(tmp_path):
    out = tmp_path / "chat.json"
    stdin = b"\n   \n\xff\xfe bad\nIn the beginning\n\n\t\nAnd God said\n/save " + str(out).encode() + b"\n"
    env = {**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run([sys.executable, "main.py", "chat", "--device", "cpu", "--max-tokens", "4"],
                          input=stdin, capture_output=True, cwd=ROOT, env=env, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert errors(err) == ["error: the line is not UTF-8 text; set the terminal to UTF-8 (e.g. LANG=C.UTF-8) "
                           "and type it again"]
    msgs = saved(out)
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 2
    assert [m["content"] for m in msgs[::2]] == ["In the beginning", "And God said"]
    assert all(m["content"] for m in msgs[1::2])


# ---- the context-overflow policy -----------------------------------------------------------------------

def test_twenty_four_turns_keep_going_under_drop_oldest(monkeypatch, capsys, tmp_path):
    lines = [LONG_LINE.format(i) for i in range(24)] + [f"/save {tmp_path / 'c.json'}"]
    rc, out, err, left = run_chat(monkeypatch, capsys, lines, *SHORT_CONTEXT)
    assert rc == 0 and not errors(err) and not left
    msgs = saved(tmp_path / "c.json")
    assert len(msgs) == 48                         # the transcript keeps every turn, dropped or not
    assert msgs[0]["content"] == LONG_LINE.format(0) and all(m["content"] for m in msgs[1::2])
    notes = [line for line in err.splitlines() if "tokens of the prompt to fit the 128-token context" in line]
    assert len(notes) >= 18 and notes[0].startswith("note: dropped the first ")


def test_stop_reports_the_overflow_and_keeps_the_session(monkeypatch, capsys, tmp_path):
    lines = [LONG_LINE.format(i) for i in range(24)] + [f"/save {tmp_path / 'before.json'}", "/reset",
                                                        "In the beginning", f"/save {tmp_path / 'after.json'}"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--context-overflow", "stop", *SHORT_CONTEXT)
    assert rc == 0
    refused = errors(err)
    assert len(refused) >= 18 and all("plus 4 for the reply, but the context holds 128; shorten the prompt or switch the "
                           "context-overflow policy to drop-oldest" in e for e in refused)
    assert "/reset starts a new chat; /context-overflow drop-oldest drops the oldest turns instead" in err
    before = saved(tmp_path / "before.json")
    assert len(before) == 2 * (24 - len(refused))       # refused turns never entered the conversation
    assert [m["content"] for m in saved(tmp_path / "after.json")][0] == "In the beginning"
    assert "(conversation cleared)" in out


def test_a_chat_template_conversation_drops_whole_turns(monkeypatch, capsys, chat_model, tmp_path):
    lines = [f"Hello world, how are you today? Turn {i}." for i in range(12)] + [f"/save {tmp_path / 'c.json'}"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--max-model-len", "64", "--system", "Be brief.",
                               model=chat_model)
    assert rc == 0 and not errors(err)
    assert "oldest messages to fit the 64-token context" in err
    msgs = saved(tmp_path / "c.json")
    assert msgs[0] == {"role": "system", "content": "Be brief."} and len(msgs) == 1 + 24


def test_a_chat_message_too_long_for_the_context_is_refused_and_the_chat_goes_on(monkeypatch, capsys, chat_model,
                                                                                 tmp_path):
    lines = ["Hello world! " * 30, "Hello", f"/save {tmp_path / 'c.json'}"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--max-model-len", "64", model=chat_model)
    assert rc == 0
    refused, = errors(err)
    assert refused.startswith("error: the newest message needs ") and refused.endswith("send a shorter message")
    assert [m["content"] for m in saved(tmp_path / "c.json")][0] == "Hello"


def test_the_policy_can_change_during_the_session(monkeypatch, capsys):
    rc, out, err, _ = run_chat(monkeypatch, capsys, ["/context-overflow", "/context-overflow stop",
                                                     "/context-overflow sideways"])
    assert "(context-overflow: drop-oldest)" in out and "(context-overflow: stop)" in out
    assert errors(err) == ["error: context-overflow policy must be one of drop-oldest, stop (got 'sideways')"]


# ---- Ctrl-C and failing turns ---------------------------------------------------------------------------

def test_ctrl_c_at_the_prompt_explains_and_only_twice_in_a_row_quits(monkeypatch, capsys, tmp_path):
    lines = [KeyboardInterrupt, "In the beginning", f"/save {tmp_path / 'c.json'}", KeyboardInterrupt,
             KeyboardInterrupt, "never read"]
    rc, out, err, left = run_chat(monkeypatch, capsys, lines)
    assert rc == 0 and left == ["never read"]
    assert out.count(QUIT_HINT) == 2
    assert len(saved(tmp_path / "c.json")) == 2


def fail_step(monkeypatch, on_call: int, error: BaseException):
    """Make the ``on_call``-th engine step raise ``error`` (once)."""
    real, calls = engine_mod.LLMEngine.step, []

    def step(self):
        calls.append(1)
        if len(calls) == on_call:
            raise error
        return real(self)
    monkeypatch.setattr(engine_mod.LLMEngine, "step", step)


def test_ctrl_c_during_a_reply_stops_it_and_keeps_what_it_said(monkeypatch, capsys, tmp_path):
    fail_step(monkeypatch, 4, KeyboardInterrupt())
    lines = ["In the beginning", "And God said", f"/save {tmp_path / 'c.json'}"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--max-tokens", "12")
    assert rc == 0 and "(stopped)" in out
    msgs = saved(tmp_path / "c.json")
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 2
    assert msgs[1]["content"] and len(msgs[1]["content"]) < len(msgs[3]["content"])


@pytest.mark.parametrize("on_call, kept", [(1, 2), (3, 4)])
def test_a_step_that_fails_prints_one_line_and_the_chat_goes_on(monkeypatch, capsys, tmp_path, on_call, kept):
    fail_step(monkeypatch, on_call, DeviceOutOfMemoryError("the GPU ran out of memory running a step; lower --prefill-chunk"))
    lines = ["In the beginning", "And God said", f"/save {tmp_path / 'c.json'}"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--max-tokens", "12")
    assert rc == 0
    assert errors(err) == ["error: the GPU ran out of memory running a step; lower --prefill-chunk"]
    msgs = saved(tmp_path / "c.json")
    # failing before a word: the turn never happened; failing part-way: what was said is kept
    assert len(msgs) == kept and msgs[-2]["content"] == "And God said" and msgs[-1]["content"]



# ---- a model folder's chat template that fails -------------------------------------------------------------
TURNS = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
         "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def with_template(chat_model: Path, folder: Path, template: str) -> Path:
    """A copy of ``chat_model`` whose chat template is ``template``, in chat_template.jinja."""
    shutil.copytree(chat_model, folder)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder


def test_a_template_that_fails_on_its_own_is_one_line_naming_its_file_and_fixing_it_works(monkeypatch, capsys,
                                                                                         chat_model, tmp_path):
    model = with_template(chat_model, tmp_path / "m", "{{ bos_token }}\n{{ persona.greeting }}\n" + TURNS)
    lines = ["Hello", "Again", f"/save {tmp_path / 'c.json'}!"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, model=model)
    told = (f"error: the model folder's chat template failed at line 2 of {model / 'chat_template.jinja'} ('persona' "
            "is undefined); fix the template there and start the chat again")
    assert rc == 0 and errors(err) == [told, told] and "Traceback" not in err
    assert saved(tmp_path / "c.json") == []                 # the turns never happened
    (model / "chat_template.jinja").write_text(TURNS, encoding="utf-8")     # the fix it names
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, model=model)
    assert rc == 0 and not errors(err)
    assert [m["role"] for m in saved(tmp_path / "c.json")] == ["user", "assistant"] * 2


def test_a_template_that_refuses_the_system_prompt_says_to_start_without_system(monkeypatch, capsys, chat_model,
                                                                                tmp_path):
    refuses = ("{%- if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
               + TURNS)
    model = with_template(chat_model, tmp_path / "m", refuses)
    lines = ["Hello", f"/save {tmp_path / 'c.json'}!"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--system", "Be brief.", model=model)
    assert rc == 0 and errors(err) == [
        f"error: the model folder's chat template refused a system message at line 1 of {model / 'chat_template.jinja'}"
        " (System role not supported); start the chat again without --system"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, model=model)      # the fix it names
    assert rc == 0 and not errors(err)
    assert [m["role"] for m in saved(tmp_path / "c.json")] == ["user", "assistant"]


def test_a_template_that_refuses_whatever_the_chat_says_to_fix_the_template_not_to_drop_system(monkeypatch, capsys,
                                                                                              chat_model, tmp_path):
    needs_tools = "{%- if not tools %}{{ raise_exception('This model needs tools') }}{%- endif %}" + TURNS
    model = with_template(chat_model, tmp_path / "m", needs_tools)
    lines = ["Hello", f"/save {tmp_path / 'c.json'}!"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--system", "Be brief.", model=model)
    assert rc == 0 and errors(err) == [
        f"error: the model folder's chat template refused the conversation at line 1 of "
        f"{model / 'chat_template.jinja'} (This model needs tools); fix the template there and start the chat again"]
    (model / "chat_template.jinja").write_text(TURNS, encoding="utf-8")     # the fix it names
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines, "--system", "Be brief.", model=model)
    assert rc == 0 and not errors(err)
    assert [m["role"] for m in saved(tmp_path / "c.json")] == ["system", "user", "assistant"]

# ---- commands ----------------------------------------------------------------------------------------------

def test_save_never_replaces_a_file_unless_told_to(monkeypatch, capsys, tmp_path):
    mine = tmp_path / "notes.md"
    mine.write_text("my own notes\n")
    lines = ["In the beginning", f"/save {mine}", f"/save {tmp_path}", f"/save {tmp_path / 'no' / 'such.md'}",
             "/save", f"/save {tmp_path / 'chat.md'}", f"/save {mine}!"]
    rc, out, err, _ = run_chat(monkeypatch, capsys, lines)
    assert rc == 0
    assert errors(err) == [
        f"error: {mine} already exists and is kept; choose another name, or add ! to replace it (/save {mine}!)",
        f"error: {tmp_path} is a folder; give a file name, e.g. /save {tmp_path / 'chat.md'}",
        f"error: the folder {tmp_path / 'no'} does not exist; create it or choose another path",
        "error: /save needs a file name, e.g. /save chat.md (a name ending in .json writes JSON)"]
    md = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert md.startswith("# Strata chat — demo\n\n### user\n\nIn the beginning\n\n### assistant\n\n")
    assert mine.read_text(encoding="utf-8") == md                 # replaced only when asked with !
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.md", "notes.md"]     # no temporary files left


def test_help_unknown_commands_and_text_that_begins_with_a_slash(monkeypatch, capsys, tmp_path):
    lines = ["/help", "/bogus", "//etc is a folder", f"/save {tmp_path / 'c.json'}", "/quit", "never read"]
    rc, out, err, left = run_chat(monkeypatch, capsys, lines)
    assert rc == 0 and left == ["never read"]
    assert "/save FILE" in out and "/context-overflow" in out and "/exit, /quit" in out
    assert errors(err) == ["error: unknown command /bogus; /help lists the commands (start a line with // to send "
                           "text that begins with /)"]
    assert saved(tmp_path / "c.json")[0] == {"role": "user", "content": "/etc is a folder"}


# ---- notes from loading, and generate under the same policy ------------------------------------------

def test_load_notes_are_printed_as_note_lines(monkeypatch, capsys):
    real = engine_mod.load_model

    def load_with_notes(config, progress=None):
        loaded = real(config, progress)
        loaded.info = dataclasses.replace(loaded.info, notes=("first note", "second note"))
        return loaded
    monkeypatch.setattr(engine_mod, "load_model", load_with_notes)
    rc, out, err, _ = run_chat(monkeypatch, capsys, [])
    assert rc == 0 and "note: first note\nnote: second note\n" in err


def test_generate_follows_the_policy_too(capsys):
    prompt = " ".join(LONG_LINE.format(i) for i in range(30))
    args = ["generate", "--device", "cpu", "--max-tokens", "4", "--temperature", "0", "--prompt", prompt]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the prompt needs ") and err.count("\n") == 1
    assert main(args + ["--context-overflow", "drop-oldest", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["completion_tokens"] == 4
    assert "tokens of the prompt to fit the 512-token context" in err


def test_generate_says_when_the_context_ended_the_reply_before_max_tokens(capsys):
    args = ["generate", "--device", "cpu", "--max-model-len", "8", "--max-tokens", "16", "--temperature", "0",
            "--prompt", "Hello", "--json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    made = json.loads(out)["completion_tokens"]
    assert made < 16 and (f"note: the reply stopped after {made} tokens, at the end of the 8-token context, "
                          "before --max-tokens 16") in err


def test_a_think_models_reasoning_prints_first_and_only_its_answer_stays_in_the_chat(tmp_path, capsys):
    # Qwen3 / GLM-4.5 write their reasoning in <think> tags: it prints before the answer (dimmed on a
    # terminal) and the next turn's prompt holds the answer alone. The reply is scripted: a random model
    # writes no tags of its own.
    from types import SimpleNamespace

    from engine.cli.chat import ChatSession
    from engine.outputs import RequestDelta
    from engine.sampling import SamplingParams
    from engine.tokenizer import Tokenizer
    from tiny_models import build_tiny_think_model
    tok = Tokenizer.from_dir(build_tiny_think_model(tmp_path / "think"))
    ids = [tok.think.open_id, *tok.encode("\nhmm, two\n", add_special_tokens=False), tok.think.close_id,
           *tok.encode("\n\nIt is 2.", add_special_tokens=False)]

    class Scripted:
        tokenizer, context_tokens = tok, 512
        model_info = SimpleNamespace(name="think", completion_only=False)

        def __init__(self):
            self.prompts, self.steps = [], []

        def add_request(self, request_id, prompt, params):
            self.prompts.append(list(prompt))
            self.steps = [ids[:4], ids[4:]]
            return "r"

        def step(self):
            part = self.steps.pop(0)
            done = not self.steps
            return [RequestDelta("r", tuple(part), tok.decode(part), done, "stop" if done else None, 5, len(ids))]

        def abort_now(self, request_id):
            return None

    engine = Scripted()
    chat = ChatSession(engine, SamplingParams(max_tokens=50), None, "drop-oldest")
    chat._turn("what is 1 + 1?")
    out = capsys.readouterr().out
    assert out.index("hmm, two") < out.index("It is 2.") and "<think>" not in out
    assert chat.messages[-1] == {"role": "assistant", "content": "It is 2."}
    chat._turn("and 2 + 2?")
    assert "hmm" not in tok.decode(engine.prompts[-1]) and "It is 2." in tok.decode(engine.prompts[-1])


def test_a_reasoning_effort_given_to_a_model_without_one_is_noted_not_silently_dropped(monkeypatch, capsys, chat_model):
    note = "note: --reasoning-effort is not used: this model has no reasoning effort setting"
    rc, _, err, _ = run_chat(monkeypatch, capsys, [], "--reasoning-effort", "high", model=chat_model)
    assert rc == 0 and note in err
    rc, _, err, _ = run_chat(monkeypatch, capsys, [], model=chat_model)        # not given: nothing to say
    assert rc == 0 and note not in err


def test_a_models_control_characters_are_shown_on_a_terminal_not_obeyed(monkeypatch, capsys):
    # a reply that clears the screen, recolours it and sets the window title must not do so in the user's terminal
    import sys

    from engine.cli.run import Reply
    from engine.outputs import RequestDelta
    said = "\x1b[2J\x1b[31mRED\x1b]0;PWNED\x07 stays\tas\nwritten"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    Reply().add(RequestDelta("r", (1,), said, False), echo=True)
    assert capsys.readouterr().out == "^[[2J^[[31mRED^[]0;PWNED^G stays\tas\nwritten"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)     # to a file or a pipe: as the model wrote it
    reply = Reply()
    reply.add(RequestDelta("r", (1,), said, False), echo=True)
    assert capsys.readouterr().out == said and reply.text == said
