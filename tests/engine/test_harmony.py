"""The harmony chat format: prompts rendered with the reasoning effort, replies read into reasoning, answer
and tool calls (whole or token by token), the o200k vocabulary written from a tokenizer.json, and — where
an o200k file is at hand — openai-harmony and the template/token-reader fallback agreeing exactly."""
from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from harmony_model import build_tiny_harmony_tokenizer
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from engine.chat_format import o200k
from engine.chat_format.harmony import (
    HarmonyCall,
    HarmonyChat,
    HarmonyDelta,
    LibraryReader,
    TokenReader,
    parse_header,
)
from engine.tokenizer import Tokenizer
from tests.engine.tokenizer_fixtures import build_tiny_tokenizer

REPLY = ("<|channel|>analysis<|message|>The user greets; answer kindly.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>Hello! 😀 How are you?<|return|>")
CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{\"city\": \"Paris\"}<|call|>")
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet them"},
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "call the tool",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 20}"},
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(build_tiny_harmony_tokenizer(tmp_path_factory.mktemp("harmony_tok")))


def ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_a_tokenizer_without_the_special_tokens_is_not_harmony(tmp_path):
    build_tiny_tokenizer(tmp_path)
    assert Tokenizer.from_dir(tmp_path).harmony is None


def test_a_tiny_vocabulary_uses_the_template_and_the_token_reader(tok):
    chat = tok.harmony
    assert chat is not None and chat.engine_name == "chat template"
    assert isinstance(chat.reader().inner, TokenReader)
    assert [chat.ids.start, chat.ids.call] == [tok.token_to_id("<|start|>"), tok.token_to_id("<|call|>")]


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_the_reasoning_effort_is_written_into_the_system_message(tok, effort):
    text = tok.decode(tok.harmony.render([{"role": "user", "content": "hi"}], effort), skip_special_tokens=False)
    assert text.startswith("<|start|>system<|message|>")
    assert f"Reasoning: {effort}\n" in text
    assert text.endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")


def test_an_unknown_effort_is_refused_naming_the_choices(tok):
    with pytest.raises(ValueError, match="low, medium, high"):
        tok.harmony.render([{"role": "user", "content": "hi"}], "max")


def test_every_role_renders_in_its_place(tok):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object"}}}]
    text = tok.decode(tok.harmony.render(CONVERSATION, "high", tools), skip_special_tokens=False)
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools" in text
    assert "type get_weather = " in text
    # the answered turn's reasoning is dropped; the open turn (a call awaiting its result) keeps it
    assert "greet them" not in text
    assert "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>" in text
    assert ("<|start|>assistant<|channel|>analysis<|message|>call the tool<|end|>"
            "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
            "<|message|>{\"city\": \"Paris\"}<|call|>") in text
    assert text.endswith("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                         "{\"temp\": 20}<|end|><|start|>assistant")


def test_an_empty_answer_keeps_its_turn_between_the_user_messages(tok):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "still there?"}]
    text = tok.decode(tok.harmony.render(messages, "low"), skip_special_tokens=False)
    assert ("<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|><|end|>"
            "<|start|>user<|message|>still there?<|end|>") in text


def test_a_reply_reads_into_reasoning_and_answer(tok):
    out = tok.harmony.parse(ids(tok, REPLY))
    assert out == HarmonyDelta(reasoning="The user greets; answer kindly.", content="Hello! 😀 How are you?")


def test_a_call_reads_as_a_tool_call_with_its_arguments(tok):
    out = tok.harmony.parse(ids(tok, CALL))
    assert out == HarmonyDelta(reasoning="Need the weather.", calls=(HarmonyCall("get_weather", '{"city": "Paris"}'),))


def test_a_reply_cut_inside_a_call_is_no_call_and_keeps_its_text_apart(tok):
    # a chat shows what the model wrote; the server drops it, as it drops a cut call of other formats
    cut = CALL[:CALL.index("Paris")]
    out = tok.harmony.parse(ids(tok, cut))
    assert out.calls == () and out.content == "" and out.cut_call == '{"city": "'


def test_messages_of_one_kind_read_as_paragraphs(tok):
    # A preamble (commentary, no recipient) and the final answer are both content: two messages, two
    # paragraphs, not "Checking.Hello!"; so are two reasoning messages. Streamed, the same.
    reply = ("<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
             "<|end|><|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
             "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>")
    want = HarmonyDelta(reasoning="First.\n\nSecond.", content="Checking.\n\nHello!")
    assert tok.harmony.parse(ids(tok, reply)) == want
    reader = tok.harmony.reader()
    assert sum((reader.feed([t]) for t in ids(tok, reply)), HarmonyDelta()) + reader.finish() == want


def test_a_reply_that_never_uses_the_format_comes_back_as_its_text(tok):
    # A model that writes plain text (no harmony token at all) would read as nothing: its text is the
    # content, streamed as it comes; a reply that used the format reads as the format says.
    plain = tok.encode("just some words", add_special_tokens=False)
    assert tok.harmony.parse(plain) == HarmonyDelta(content="just some words")
    reader = tok.harmony.reader()
    steps = [reader.feed([t]) for t in plain]
    assert all(s.content for s in steps[:-1]) and steps[0].content == tok.decode(plain[:1])
    assert sum(steps, HarmonyDelta()) + reader.finish() == HarmonyDelta(content="just some words")
    header_only = ids(tok, REPLY)[:3]                                  # a header cut short: no text to show
    assert tok.harmony.parse(header_only) == HarmonyDelta() and tok.harmony.parse([]) == HarmonyDelta()
    # text with harmony's tokens strewn in it (a random model) but never a message: its words, not nothing
    start, end = ids(tok, "<|start|>"), ids(tok, "<|end|>")
    strewn = plain[:2] + start + plain[2:] + end
    assert tok.harmony.parse(strewn) == HarmonyDelta(content="just some words")


def test_plain_text_streams_until_a_harmony_token_begins_the_format(tok):
    # the text before the format's first token was that header's start: what follows reads as the format says
    reader = tok.harmony.reader()
    said = [reader.feed([t]) for t in ids(tok, "Hi there")]
    assert "".join(s.content for s in said) == "Hi there" and said[0].content
    rest = reader.feed(ids(tok, "<|channel|>final<|message|>Hello!<|return|>")) + reader.finish()
    assert rest == HarmonyDelta(content="Hello!")


def test_a_reply_that_opens_with_its_recipient_is_held_and_reads_as_a_call(tok):
    reader = tok.harmony.reader()
    assert not any(reader.feed([t]) for t in ids(tok, " to=functions.get_weather"))
    call = reader.feed(ids(tok, '<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>'))
    assert call + reader.finish() == HarmonyDelta(calls=(HarmonyCall("get_weather", '{"city": "Paris"}'),))


@pytest.mark.parametrize("opening", ["  ", " t", " to"])
def test_text_that_may_yet_open_a_recipient_is_held_until_it_cannot(tok, opening):
    reader = tok.harmony.reader()
    assert not any(reader.feed([t]) for t in ids(tok, opening))
    assert reader.feed(ids(tok, "x")) == HarmonyDelta(content=opening + "x")      # no recipient: plain text
    cut = tok.harmony.reader()
    assert not any(cut.feed([t]) for t in ids(tok, opening)) and cut.finish() == HarmonyDelta(content=opening)


@pytest.mark.parametrize("text", [REPLY, CALL])
def test_streamed_deltas_add_up_to_the_whole_reply_and_never_mix_channels(tok, text):
    reader = tok.harmony.reader()
    steps = [reader.feed([t]) for t in ids(tok, text)] + [reader.finish()]
    assert sum(steps, HarmonyDelta()) == tok.harmony.parse(ids(tok, text))
    assert not any(s.reasoning and s.content for s in steps)       # one token, one channel
    first_content = next(i for i, s in enumerate(steps) if s.content or s.calls)
    assert all(not s.reasoning for s in steps[first_content:])     # reasoning comes first, whole
    assert not any("<|" in s.reasoning + s.content for s in steps)


def test_headers_name_channel_and_recipient_wherever_the_recipient_stands():
    assert parse_header("assistant<|channel|>final") == ("final", None)
    assert parse_header("<|channel|>commentary to=functions.f <|constrain|>json") == ("commentary", "functions.f")
    assert parse_header("assistant to=functions.g<|channel|>commentary <|constrain|>json") == ("commentary", "functions.g")


# ---- the o200k vocabulary file ---------------------------------------------------------------------------

BYTE_CHARS = {b: c for c, b in o200k._byte_decoder().items()}


def byte_level(raw: bytes) -> str:
    return "".join(BYTE_CHARS[b] for b in raw)


def test_the_byte_alphabet_is_the_one_tokenizers_uses():
    assert set(o200k._byte_decoder()) == set(pre_tokenizers.ByteLevel.alphabet())


def test_a_vocabulary_becomes_tiktoken_lines_in_rank_order():
    tokens = [b"!", b" the", "é".encode(), b"\n\n", bytes([0xFF])]
    text = o200k.tiktoken_text(lambda i: byte_level(tokens[i]), len(tokens))
    assert text.splitlines() == [base64.b64encode(t) + f" {i}".encode() for i, t in enumerate(tokens)]
    assert o200k.tiktoken_text(lambda i: None if i == 2 else "a", 3) is None


def test_a_vocabulary_that_is_not_o200k_writes_nothing(tmp_path):
    assert not o200k.write_o200k(lambda i: "a", 100, tmp_path)                # too small
    assert not o200k.write_o200k(lambda i: "a", o200k.O200K_TOKENS, tmp_path)  # the hash does not match
    assert list(tmp_path.iterdir()) == []
    assert o200k.load_encoding(tmp_path) is None                              # and nothing is downloaded


# ---- openai-harmony itself, where an o200k file is at hand (tests never download one) ----------------------

O200K = o200k.default_cache_dir()
needs_o200k = pytest.mark.skipif(not o200k._cached(O200K) or o200k.load_encoding(O200K) is None,
                                 reason=f"no checked o200k_base.tiktoken in {O200K}, or no openai-harmony")


@pytest.fixture(scope="module")
def o200k_tok(tmp_path_factory) -> Tokenizer:
    """A tokenizer with gpt-oss's numbering: o200k's ranks, then harmony's tokens at their ids."""
    vocab = {}
    for line in (O200K / o200k.FILE_NAME).read_bytes().splitlines():
        b64, rank = line.split()
        vocab[byte_level(base64.b64decode(b64))] = int(rank)
    backend = Backend(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    fill = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200001: "<|reserved_200001|>",
            200002: "<|return|>", 200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>",
            200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}
    specials = [fill.get(i, f"<|reserved_{i}|>") for i in range(199998, 200013)]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    folder = tmp_path_factory.mktemp("o200k_tok")
    backend.save(str(folder / "tokenizer.json"))
    build_tiny_harmony_template(folder)
    return Tokenizer.from_dir(folder)


def build_tiny_harmony_template(folder: Path) -> None:
    import json

    from harmony_model import HARMONY_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": HARMONY_TEMPLATE}), encoding="utf-8")


@needs_o200k
def test_an_o200k_vocabulary_runs_on_openai_harmony_and_agrees_with_the_fallback(o200k_tok):
    chat = o200k_tok.harmony
    assert chat.engine_name == "openai-harmony" and isinstance(chat.reader().inner, LibraryReader)
    fallback = HarmonyChat(o200k_tok, chat.ids)           # the same model without the library
    text = lambda tokens: o200k_tok.decode(tokens, skip_special_tokens=False)
    for effort in ("low", "high"):      # the same text (this test vocabulary has no merges: other splits)
        assert text(chat.render(CONVERSATION, effort)) == text(fallback.render(CONVERSATION, effort))
    for text in (REPLY, CALL, CALL[:CALL.index("Paris")]):
        tokens = chat.encoding.encode(text, allowed_special="all")
        lib, tpl = chat.reader(), fallback.reader()
        assert [lib.feed([t]) for t in tokens] + [lib.finish()] == [tpl.feed([t]) for t in tokens] + [tpl.finish()]
    assert hashlib.sha256((O200K / o200k.FILE_NAME).read_bytes()).hexdigest() == o200k.O200K_SHA256


@needs_o200k
def test_the_library_keeps_an_empty_answer_as_the_template_does(o200k_tok):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "again"}]
    chat = o200k_tok.harmony
    text = lambda tokens: o200k_tok.decode(tokens, skip_special_tokens=False)
    assert text(chat.render(messages, "low")) == text(HarmonyChat(o200k_tok, chat.ids).render(messages, "low"))


@needs_o200k
def test_the_o200k_file_is_written_from_a_tokenizer_json(o200k_tok, tmp_path):
    assert o200k.write_o200k(o200k_tok.vocab_token, o200k_tok.vocab_size, tmp_path)
    assert o200k.load_encoding(tmp_path) is not None


# ---- the terminal chat ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def harmony_engine(tmp_path_factory):
    from harmony_model import build_tiny_harmony_model

    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    eng = LLMEngine(EngineConfig(model=str(build_tiny_harmony_model(tmp_path_factory.mktemp("cli") / "m")),
                                 device="cpu"))
    yield eng
    eng.close()


def scripted_params(tok: Tokenizer, script: str):
    """Sampling that makes the tiny random model write ``script`` (special tokens forced as tokens)."""
    import json
    import re

    from engine.guided import Guide
    from engine.sampling import SamplingParams
    parts = [f"<[{tok.token_to_id(p)}]>" if p.startswith("<|") else json.dumps(p)
             for p in re.split(r"(<\|[a-z]+\|>)", script) if p]
    return SamplingParams(max_tokens=200, temperature=0, guide=Guide("lark", "start: " + " ".join(parts) + "\n"))


@pytest.mark.parametrize("tty", [True, False])
def test_the_cli_chat_prints_reasoning_dimmed_on_a_terminal_only(harmony_engine, monkeypatch, capsys, tty):
    from engine.cli.chat import ChatSession
    session = ChatSession(harmony_engine, scripted_params(harmony_engine.tokenizer, REPLY), None, "drop-oldest")
    feed = iter(["hi", "/reasoning high", "/reasoning max"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(feed))
    monkeypatch.setattr("sys.stdout.isatty", lambda: tty, raising=False)
    with pytest.raises(StopIteration):
        session.run()
    out, err = capsys.readouterr()
    reasoning, answer = "The user greets; answer kindly.", "Hello! 😀 How are you?"
    shown = f"\x1b[2m{reasoning}\x1b[0m" if tty else reasoning
    assert f"{shown}\n\n{answer}" in out
    assert ("\x1b[" in out) == tty
    assert session.messages[-1] == {"role": "assistant", "content": answer, "reasoning_content": reasoning}
    assert session.effort == "high" and "(reasoning: high)" in out
    assert "reasoning effort must be one of low, medium, high" in err
    session.messages.append({"role": "user", "content": "and now?"})      # the next turn's prompt
    prompt = harmony_engine.tokenizer.decode(session._fit().token_ids, skip_special_tokens=False)
    assert "Reasoning: high\n" in prompt and reasoning not in prompt      # an answered turn's reasoning goes


def test_the_chat_command_takes_a_reasoning_effort(capsys):
    from engine.cli.main import build_parser
    parser, _ = build_parser()
    assert parser.parse_args(["chat", "--model", "m", "--reasoning-effort", "high"]).reasoning_effort == "high"
    assert parser.parse_args(["chat", "--model", "m"]).reasoning_effort is None     # the session's medium
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["chat", "--model", "m", "--reasoning-effort", "max"])
    assert e.value.code == 2 and "choose from 'low', 'medium', 'high'" in capsys.readouterr().err


def test_a_raw_continuation_keeps_the_harmony_markup_its_channel_names_need(harmony_engine, capsys):
    # generate's text: without the special tokens the reply read "analysisThe user greets...assistantfinalHello!"
    from engine.cli.run import stream
    tok = harmony_engine.tokenizer
    reply = stream(harmony_engine, tok.encode("hi"), scripted_params(tok, REPLY), markup=True)
    assert reply.text == REPLY and capsys.readouterr().out == REPLY
    # generate --json prints the summary: the detokenizer kept for the markup is not part of it
    assert json.loads(json.dumps(reply.summary())) == {
        "text": REPLY, "token_ids": reply.token_ids, "finish_reason": reply.finish_reason,
        "ttft_ms": reply.ttft_ms, "prompt_tokens": reply.prompt_tokens, "completion_tokens": len(reply.token_ids)}
    plain = stream(harmony_engine, tok.encode("hi"), scripted_params(tok, REPLY), echo=False)
    assert "<|channel|>" not in plain.text and plain.text.startswith("analysis")
