"""The context-overflow policy every front end shares: fit a chat or a completion prompt into the context."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.context import (DEFAULT_OVERFLOW, OVERFLOW_POLICIES, ContextOverflowError, FittedPrompt, fit_messages,
                            fit_text, reply_room)
from engine.errors import ConfigError
from engine.tokenizer import Tokenizer

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"


class WordTokenizer:
    """One token per word; a message renders as ``<role> words </>``, the generation prompt as ``<assistant>``.

    So a message of n words costs n + 2 tokens and the generation prompt 1: sizes a test can count.
    """

    BOS = 1

    def __init__(self, bos: bool = False) -> None:
        self.bos = bos
        self.vocab: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]
        return ([self.BOS] if self.bos and add_special_tokens else []) + ids

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        text = " ".join(f"<{m['role']}> {m['content']} </>" for m in messages)
        text += " <assistant>" if add_generation_prompt else ""
        return self.encode(text, add_special_tokens=False) if tokenize else text


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def chat(turns: int, n_words: int = 8, system: bool = True) -> list[dict]:
    """A system prompt, then ``turns`` user/assistant turns, then a newest user message."""
    msgs = [{"role": "system", "content": words(4, "sys")}] if system else []
    for t in range(turns):
        msgs += [{"role": "user", "content": words(n_words, f"u{t}_")},
                 {"role": "assistant", "content": words(n_words, f"a{t}_")}]
    return msgs + [{"role": "user", "content": words(n_words, "newest")}]


def test_policies_are_the_shared_names():
    assert OVERFLOW_POLICIES == ("drop-oldest", "stop") and DEFAULT_OVERFLOW == "drop-oldest"


def test_a_conversation_that_fits_is_rendered_whole():
    tok, msgs = WordTokenizer(), chat(2)
    fitted = fit_messages(tok, msgs, context_tokens=200, max_tokens=16)
    assert fitted.token_ids == tok.apply_chat_template(msgs, tokenize=True)
    assert fitted.prompt_tokens == len(fitted.token_ids) == 6 + 4 * 10 + 10 + 1
    assert (fitted.dropped_messages, fitted.dropped_tokens, fitted.note) == (0, 0, "")
    assert fitted.reply_tokens == 16 and fitted.context_tokens == 200


def test_drop_oldest_drops_whole_turns_and_keeps_the_system_prompt_and_newest_message():
    tok, msgs = WordTokenizer(), chat(6)           # 6 + 6 * 20 + 10 + 1 = 137 tokens
    fitted = fit_messages(tok, msgs, context_tokens=100, max_tokens=20, policy="drop-oldest")
    # 100 - 20 for the reply = 80: system (6) + newest (10) + generation prompt (1) + 3 turns of 20
    assert fitted.dropped_messages == 6 and fitted.prompt_tokens == 77
    kept = [msgs[0]] + msgs[1 + 6:]
    assert fitted.token_ids == tok.apply_chat_template(kept, tokenize=True)
    assert fitted.prompt_tokens + fitted.reply_tokens <= fitted.context_tokens
    assert fitted.note == "dropped the 6 oldest messages to fit the 100-token context"


def test_drop_oldest_drops_as_little_as_possible():
    tok = WordTokenizer()
    for turns in range(1, 12):
        msgs = chat(turns)
        for context in (60, 81, 97, 140):
            fitted = fit_messages(tok, msgs, context, max_tokens=10)
            assert fitted.prompt_tokens + fitted.reply_tokens <= context
            if fitted.dropped_messages:
                # keeping one more turn would not have fit
                fewer = [msgs[0]] + msgs[1 + fitted.dropped_messages - 2:]
                assert len(tok.apply_chat_template(fewer, tokenize=True)) + fitted.reply_tokens > context


def test_one_message_dropped_is_said_in_the_singular():
    tok = WordTokenizer()
    msgs = [{"role": "assistant", "content": words(10, "hello")}] + chat(1, system=False)
    fitted = fit_messages(tok, msgs, context_tokens=50, max_tokens=10)     # 12 + 20 + 10 + 1 > 40
    assert fitted.dropped_messages == 1                # a greeting before the first user message goes alone
    assert fitted.note == "dropped the oldest message to fit the 50-token context"


def test_a_trailing_assistant_message_stays_with_the_newest_user_message():
    tok = WordTokenizer()
    msgs = chat(3) + [{"role": "assistant", "content": "Sure,"}]
    fitted = fit_messages(tok, msgs, context_tokens=40, max_tokens=10)     # 6 + 10 + 3 + 1 fit in 30
    kept = [msgs[0]] + msgs[-2:]
    assert fitted.token_ids == tok.apply_chat_template(kept, tokenize=True)


def test_a_later_system_message_is_dropped_with_its_turn():
    tok = WordTokenizer()
    msgs = chat(2)
    msgs.insert(2, {"role": "system", "content": "be brief"})    # inside the first turn
    fitted = fit_messages(tok, msgs, context_tokens=48, max_tokens=10)
    assert fitted.dropped_messages == 3


def test_the_callers_messages_are_never_changed():
    tok, msgs = WordTokenizer(), chat(6)
    before = [dict(m) for m in msgs]
    fit_messages(tok, msgs, context_tokens=60, max_tokens=10)
    assert msgs == before


def test_stop_refuses_with_the_sizes_and_fixes_that_work_everywhere():
    tok, msgs = WordTokenizer(), chat(6)
    with pytest.raises(ContextOverflowError) as err:
        fit_messages(tok, msgs, context_tokens=100, max_tokens=20, policy="stop")
    msg = str(err.value)
    assert "\n" not in msg
    assert "the conversation needs 137 tokens plus 20 for the reply, but the context holds 100" in msg
    assert "start a new chat" in msg and "switch the context-overflow policy to drop-oldest" in msg
    assert err.value.droppable and "quarter" not in msg
    with pytest.raises(ContextOverflowError) as err:          # max tokens past a quarter: why 25 and not 500
        fit_messages(tok, msgs, context_tokens=100, max_tokens=500, policy="stop")
    assert "plus 25 for the reply, but the context holds 100 (a chat keeps at most a quarter of it for the " \
           "reply, so 25 of the 500 max tokens); start a new chat" in str(err.value)


def test_stop_lets_a_conversation_that_fits_through():
    tok, msgs = WordTokenizer(), chat(2)
    assert fit_messages(tok, msgs, context_tokens=200, max_tokens=16, policy="stop").dropped_messages == 0


@pytest.mark.parametrize("policy", OVERFLOW_POLICIES)
def test_a_newest_message_too_long_for_any_dropping_names_itself(policy):
    tok = WordTokenizer()
    msgs = chat(3)[:-1] + [{"role": "user", "content": words(90, "long")}]
    with pytest.raises(ContextOverflowError) as err:
        fit_messages(tok, msgs, context_tokens=100, max_tokens=10, policy=policy)
    msg = str(err.value)
    assert msg.startswith("the system prompt and the newest message need 99 tokens plus 10 for the reply")
    assert "send a shorter message or shorten the system prompt" in msg and not err.value.droppable


def test_without_a_system_prompt_the_error_names_the_message_alone():
    tok = WordTokenizer()
    with pytest.raises(ContextOverflowError, match="^the newest message needs 93 tokens plus 8 for the reply"):
        fit_messages(tok, [{"role": "user", "content": words(90, "w")}], context_tokens=32, max_tokens=100)


def test_reply_room_is_max_tokens_up_to_a_quarter_of_the_context():
    assert reply_room(512, 128) == 128
    assert reply_room(512, 100_000) == 128      # a huge max_tokens does not push the history out
    assert reply_room(512, 4) == 4
    assert reply_room(3, 50) == 1               # a reply always gets a token
    tok, msgs = WordTokenizer(), chat(6)
    fitted = fit_messages(tok, msgs, context_tokens=100, max_tokens=10**9)
    assert fitted.reply_tokens == 25 and fitted.prompt_tokens <= 75 and fitted.dropped_messages < 12


@pytest.mark.parametrize("kwargs, match", [
    (dict(policy="truncate"), "context-overflow policy must be one of drop-oldest, stop"),
    (dict(max_tokens=0), "max_tokens must be a whole number >= 1"),
    (dict(context_tokens=1), "the context must hold at least 2 tokens"),
])
def test_bad_arguments_are_one_line_config_errors(kwargs, match):
    args = dict(context_tokens=100, max_tokens=10, policy="drop-oldest") | kwargs
    for fit, prompt in ((fit_messages, chat(1)), (fit_text, "a b c")):
        with pytest.raises(ConfigError, match=match):
            fit(WordTokenizer(), prompt, **args)


# ---- completion prompts ---------------------------------------------------------------------------

def test_text_that_fits_is_encoded_as_the_engine_would():
    tok = WordTokenizer(bos=True)
    fitted = fit_text(tok, words(20, "w"), context_tokens=64, max_tokens=8)
    assert fitted.token_ids == tok.encode(words(20, "w")) and fitted.note == ""


def test_drop_oldest_keeps_the_end_of_the_text_and_the_bos():
    tok = WordTokenizer(bos=True)
    text = words(100, "w")
    fitted = fit_text(tok, text, context_tokens=64, max_tokens=16)
    body = tok.encode(text, add_special_tokens=False)
    assert fitted.token_ids == [WordTokenizer.BOS] + body[-47:]          # 64 - 16 - 1 bos
    assert fitted.dropped_tokens == 53 and fitted.dropped_messages == 0
    assert fitted.note == "dropped the first 53 tokens of the prompt to fit the 64-token context"


def test_drop_oldest_never_cuts_into_the_newest_message_of_a_text():
    # completion mode: the conversation is one text; its oldest tokens go, the newest message stays whole,
    # and a newest message longer than the context is refused as a chat's is
    tok = WordTokenizer(bos=True)
    old, newest = words(60, "o"), words(30, "n")
    fitted = fit_text(tok, old + " " + newest, context_tokens=64, max_tokens=16, newest=newest)
    assert fitted.token_ids[-30:] == tok.encode(newest, add_special_tokens=False) and fitted.dropped_tokens == 43
    for policy in ("drop-oldest", "stop"):
        with pytest.raises(ContextOverflowError, match="the newest message needs 61 tokens plus 16 for the reply, "
                                                       "but the context holds 64; send a shorter message"):
            fit_text(tok, old + " " + words(60, "n"), context_tokens=64, max_tokens=16, policy=policy,
                     newest=words(60, "n"))


def test_stop_refuses_a_text_that_does_not_fit():
    with pytest.raises(ContextOverflowError, match="the prompt needs 100 tokens plus 16 for the reply, but the "
                                                   "context holds 64; shorten the prompt or switch"):
        fit_text(WordTokenizer(), words(100, "w"), context_tokens=64, max_tokens=16, policy="stop")


# ---- the demo model's real tokenizer and chat template ----------------------------------------------

@pytest.fixture(scope="module")
def demo_tok() -> Tokenizer:
    return Tokenizer.from_dir(DEMO)


def test_a_long_chat_with_the_demo_tokenizer_fits_512_tokens(demo_tok):
    msgs = [{"role": "system", "content": "You answer in verse."}]
    for t in range(30):
        msgs += [{"role": "user", "content": f"Tell me about the kings of Israel, part {t}."},
                 {"role": "assistant", "content": "And it came to pass in those days that the king went up. " * 2}]
    msgs.append({"role": "user", "content": "And the last question?"})
    fitted = fit_messages(demo_tok, msgs, 512, max_tokens=128)
    assert fitted.prompt_tokens + 128 <= 512 and fitted.dropped_messages % 2 == 0 and fitted.dropped_messages > 0
    text = demo_tok.decode(fitted.token_ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou answer in verse.<|im_end|>")
    assert text.endswith("And the last question?<|im_end|>\n<|im_start|>assistant\n")
    assert "part 0." not in text and "part 29." in text


def test_the_demo_tokenizer_cuts_text_at_a_token_boundary(demo_tok):
    text = "In the beginning God created the heavens and the earth. " * 40
    fitted = fit_text(demo_tok, text, context_tokens=128, max_tokens=32)
    ids = demo_tok.encode(text)
    assert fitted.token_ids == ids[-96:] and fitted.dropped_tokens == len(ids) - 96
    assert isinstance(fitted, FittedPrompt)


@pytest.mark.parametrize("bad", ["hello", {"content": "no role"}, {"role": 3, "content": "x"}])
def test_a_message_that_is_not_a_role_mapping_is_named(bad):
    msgs = chat(1)[:2] + [bad] + chat(1)[2:]
    with pytest.raises(ConfigError, match="^message 3 of the conversation is not a mapping with a 'role'"):
        fit_messages(WordTokenizer(), msgs, context_tokens=100, max_tokens=10)
