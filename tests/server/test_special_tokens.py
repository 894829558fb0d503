"""Special tokens in what a tiny harmony model (gpt-oss's chat format) writes: a reply in plain text streams as
it comes, and a special token that the text of a completion leaves out moves no ``text_offset`` past it. A grammar
put on the request makes the random model write scripted tokens."""
from __future__ import annotations

import openai
import pytest
from harmony_model import build_tiny_harmony_model
from http_helpers import KEY, TIMEOUT, serving

import engine.server.completions as completions_mod
from engine.guided import Guide


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory):
    yield from serving(build_tiny_harmony_model(tmp_path_factory.mktemp("special") / "m"))


@pytest.fixture(scope="module")
def client(harmony_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=harmony_server[0].url + "/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)


def test_a_plain_text_reply_of_a_harmony_model_streams_as_it_comes(client):
    # the random model writes no harmony: its text is the content, sent step by step, not whole at the end
    ask = dict(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=40, temperature=0,
               extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**ask).choices[0].message.content
    said = [c.choices[0].delta.content for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    said = [text for text in said if text]
    assert "".join(said) == whole and len(whole) > 20
    assert len(said) > 10                               # many steps' text, not one chunk at the end


@pytest.fixture
def scripted(monkeypatch, harmony_server):
    """Make the next completions write ``script``: text, with harmony's special tokens forced as tokens."""
    tok = harmony_server[1]

    def use(script: list[str]) -> None:
        parts = [f"<[{tok.token_to_id(p)}]>" if p.startswith("<|") else f'"{p}"' for p in script]
        guide = Guide("lark", "start: " + " ".join(parts) + "\n", source="response_format")
        monkeypatch.setattr(completions_mod.structured, "read_guide", lambda value: guide)
    return use


SCRIPT = ["Hi", "<|channel|>", " there", "<|constrain|>", " you", "<|end|>", "!"]


def check_offsets(text: str, logprobs) -> None:
    """Each token's offset indexes the text: its own text starts there, and a token the text leaves out
    (a special one) takes no room."""
    ends = logprobs.text_offset[1:] + [len(text)]
    for token, at, end in zip(logprobs.tokens, logprobs.text_offset, ends):
        assert at <= len(text)
        assert text[at:end] == ("" if token.startswith("<|") and token.endswith("|>") else token), (token, at, end)


def test_text_offsets_index_the_text_after_a_special_token_it_leaves_out(client, scripted):
    scripted(SCRIPT)
    r = client.completions.create(model="m", prompt="hi", max_tokens=40, logprobs=0).choices[0]
    assert r.text == "Hi there you!"
    assert [t for t in r.logprobs.tokens if t.startswith("<|")] == ["<|channel|>", "<|constrain|>", "<|end|>"]
    check_offsets(r.text, r.logprobs)
    assert r.logprobs.text_offset[-1] == len("Hi there you")


def test_streamed_text_offsets_index_the_whole_text(client, scripted):
    scripted(SCRIPT)
    chunks = [c.choices[0] for c in client.completions.create(model="m", prompt="hi", max_tokens=40, logprobs=0,
                                                              stream=True) if c.choices]
    text = "".join(c.text for c in chunks)
    merged = [c.logprobs for c in chunks if c.logprobs is not None]
    for lp in merged[1:]:
        merged[0].tokens += lp.tokens
        merged[0].text_offset += lp.text_offset
    assert text == "Hi there you!" and len(merged[0].tokens) == len(merged[0].text_offset) >= len(SCRIPT)
    check_offsets(text, merged[0])


@pytest.fixture(scope="module")
def bos_client(tmp_path_factory):
    from tests.engine.tokenizer_fixtures import build_tiny_tokenizer
    from tiny_models import build_tiny_model
    folder = build_tiny_model(tmp_path_factory.mktemp("bos") / "m")
    build_tiny_tokenizer(folder, vocab_size=384, add_bos_token=True)
    for server, _tok in serving(folder):
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)


def test_echo_offsets_leave_out_the_bos_a_text_prompt_did_not_spell(bos_client):
    r = bos_client.completions.create(model="m", prompt="hi there", echo=True, max_tokens=4, logprobs=0,
                                      temperature=0).choices[0]
    assert r.logprobs.tokens[0].startswith("<|") and r.text.startswith("hi there")      # added, not written
    check_offsets(r.text, r.logprobs)
