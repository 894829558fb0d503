"""Reasoning between <think> tags (Qwen3, GLM-4.5): read apart from the answer, by token id."""
from __future__ import annotations

import pytest

from engine.chat_format.harmony import HarmonyDelta
from engine.tokenizer import Tokenizer
from tiny_models import build_tiny_model, build_tiny_think_model


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_dir(build_tiny_think_model(tmp_path_factory.mktemp("think") / "m"))


def _ids(tok, *parts: str) -> list[int]:
    out = []
    for p in parts:
        out += [tok.think.open_id] if p == "<think>" else [tok.think.close_id] if p == "</think>" else \
            tok.encode(p, add_special_tokens=False)
    return out


def test_a_model_whose_template_writes_the_tags_has_them(tok, tmp_path):
    assert tok.think is not None and tok.think.open_id != tok.think.close_id
    assert Tokenizer.from_dir(build_tiny_model(tmp_path / "plain")).think is None     # no tags in its vocabulary


def test_a_reply_streamed_in_any_pieces_reads_as_reasoning_then_answer(tok):
    ids = _ids(tok, "<think>", "\nfirst I count\n", "</think>", "\n\nthe answer is 4")
    whole = tok.think.parse(tok, ids)
    assert whole == HarmonyDelta(reasoning="first I count\n", content="the answer is 4")
    for step in (1, 2, 5):
        reader, got = tok.think.reader(tok), HarmonyDelta()
        for i in range(0, len(ids), step):
            got += reader.feed(ids[i:i + step])
        assert got + reader.finish() == whole, step


def test_a_prompt_that_opens_the_block_starts_the_reply_inside_it(tok):
    prompt = _ids(tok, "<|im_start|>assistant\n", "<think>", "\n")
    assert tok.think.parse(tok, _ids(tok, "ponder", "</think>", "\n\nyes"), prompt) == \
        HarmonyDelta(reasoning="ponder", content="yes")
    closed = _ids(tok, "<think>", "\n\n", "</think>", "\n\n")                  # enable_thinking false
    assert not tok.think.opened_by(closed)
    assert tok.think.parse(tok, _ids(tok, "just this"), closed) == HarmonyDelta(content="just this")


def test_a_reply_without_tags_is_all_answer_and_tag_text_in_other_tokens_stays_text(tok):
    assert tok.think.parse(tok, _ids(tok, "no thinking here")) == HarmonyDelta(content="no thinking here")
    spelled = _ids(tok, "write <", "think", "> like so")                 # the characters, not the tag's token
    assert tok.think.parse(tok, spelled) == HarmonyDelta(content="write <think> like so")
