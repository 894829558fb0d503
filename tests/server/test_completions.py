"""/v1/completions through the official openai client: text and token-id prompts, streaming, usage,
stop strings, seeds, n, logprobs and echo."""
from __future__ import annotations

import json
import math

import openai
import pytest
import torch

GREEDY = {"temperature": 0}
IDS = {"return_token_ids": True}


def test_models_lists_the_served_model(client, engine):
    models = client.models.list().data
    assert [m.id for m in models] == ["demo"]
    assert models[0].model_extra["max_model_len"] == engine.context_tokens
    assert models[0].model_extra["vocab_size"] == engine.loaded.spec.vocab_size     # what prompt ids may use


def test_a_model_is_retrieved_by_its_id_as_listed_and_another_id_is_a_404_naming_it(client, http):
    listed = http.get("/v1/models").json()["data"][0]
    assert http.get("/v1/models/demo").json() == listed
    assert client.models.retrieve("demo").model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4")
    assert err.value.body == {"message": "model \"gpt-4\" is not served here; this server serves \"demo\" "
                                         "(GET /v1/models lists it)", "type": "not_found_error", "param": "model",
                              "code": "model_not_found"}
    counted = [line for line in http.get("/metrics").text.splitlines()
               if line.startswith('strata_http_requests_total{endpoint="/v1/models/{id}",status="404"}')]
    assert counted and float(counted[0].split()[-1]) >= 1


def test_a_completion_returns_text_tokens_and_usage_equal_to_them(client, engine):
    r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=12,
                                  extra_body={**IDS, "ignore_eos": True}, **GREEDY)
    choice = r.choices[0]
    ids = choice.model_extra["token_ids"]
    assert len(ids) == 12 and choice.finish_reason == "length"
    assert choice.text == engine.tokenizer.decode(ids)
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode("Once upon a time"))
    assert r.usage.completion_tokens == len(ids) and r.usage.total_tokens == r.usage.prompt_tokens + len(ids)
    assert r.model == "demo" and r.object == "text_completion"


def test_the_model_folder_path_or_no_model_name_the_served_model(client, http, engine):
    by_name = client.completions.create(model="demo", prompt="Hi", max_tokens=4, **GREEDY).choices[0].text
    by_path = client.completions.create(model=str(engine.config.model), prompt="Hi", max_tokens=4, **GREEDY)
    unnamed = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, **GREEDY}).json()
    assert by_path.choices[0].text == unnamed["choices"][0]["text"] == by_name and by_path.model == "demo"


def test_the_folder_path_is_accepted_with_a_trailing_slash_and_a_name_is_matched_as_written(client, http, engine):
    folder = str(engine.config.model).rstrip("/")
    for model in (folder + "/", folder + "//", folder + "/."):
        r = client.completions.create(model=model, prompt="Hi", max_tokens=2, **GREEDY)
        assert r.model == "demo", model
        assert client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2).model == "demo"
    assert http.get("/v1/models/" + folder + "/").json() == http.get("/v1/models").json()["data"][0]
    for name in ("demo/", "./demo"):                     # a name is not a path: matched as written
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=name, prompt="Hi", max_tokens=2)


def test_streaming_gives_the_same_text_and_tokens_as_a_whole_reply(client):
    args = dict(model="demo", prompt="The king said", max_tokens=16, extra_body={**IDS, "ignore_eos": True}, **GREEDY)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids", [])]
    assert text == whole.choices[0].text and ids == whole.choices[0].model_extra["token_ids"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == len(ids) == 16
    assert all(c.usage is None for c in chunks[:-1])


def test_a_token_id_prompt_and_a_list_of_prompts(client, engine):
    ids = engine.tokenizer.encode("Once upon a time")
    by_ids = client.completions.create(model="demo", prompt=ids, max_tokens=6, **GREEDY)
    by_text = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=6, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    both = client.completions.create(model="demo", prompt=["Once upon a time", "The sea"], max_tokens=6, **GREEDY)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == by_text.choices[0].text
    assert both.usage.prompt_tokens == len(ids) + len(engine.tokenizer.encode("The sea"))


def test_a_stop_string_ends_the_text_before_it(client):
    free = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=30,
                                     extra_body={"ignore_eos": True}, **GREEDY).choices[0].text
    word = free.split()[3]
    cut = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=30, stop=[word],
                                    extra_body={"ignore_eos": True}, **GREEDY).choices[0]
    assert cut.finish_reason == "stop" and word not in cut.text
    assert free.startswith(cut.text) and len(cut.text) == free.index(word)


def test_a_streamed_stop_sends_no_empty_text_before_its_finish(client):
    # the tokens that might begin a stop string are held back: they send nothing until the text is known
    ask = dict(model="demo", prompt="Once upon a time", max_tokens=30, extra_body={"ignore_eos": True}, **GREEDY)
    free = client.completions.create(**ask).choices[0].text
    stop = " ".join(free.split()[3:6])                         # three words: several tokens held back for it
    chunks = [c.choices[0] for c in client.completions.create(**ask, stop=[stop], stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == free[:free.index(stop)] and chunks[-1].finish_reason == "stop"
    assert all(c.text for c in chunks[:-1]), [c.text for c in chunks]


def test_a_seed_reproduces_a_sampled_reply_and_n_gives_each_choice_its_own(client):
    args = dict(model="demo", prompt="In the morning", max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})
    a = client.completions.create(seed=7, **args).choices[0].text
    b = client.completions.create(seed=7, **args).choices[0].text
    c = client.completions.create(seed=8, **args).choices[0].text
    assert a == b and a != c
    three = client.completions.create(seed=7, n=3, **args).choices
    assert [x.index for x in three] == [0, 1, 2]
    assert [x.text for x in three] == [a, c, client.completions.create(seed=9, **args).choices[0].text]


def test_logprobs_in_the_legacy_shape(client, engine):
    r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=5, logprobs=3,
                                  extra_body={**IDS, "ignore_eos": True}, **GREEDY)
    c = r.choices[0]
    lp = c.logprobs
    ids = c.model_extra["token_ids"]
    assert lp.tokens == [engine.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == r.usage.completion_tokens == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) == 3
        assert math.isclose(max(top.values()), chosen, abs_tol=1e-4)     # greedy picks the likeliest
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


def test_echo_puts_the_prompt_first_and_scores_its_tokens(client, engine):
    prompt = "Once upon a time"
    n_prompt = len(engine.tokenizer.encode(prompt))
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=4, echo=True, logprobs=1, **GREEDY)
    c = r.choices[0]
    assert c.text.startswith(prompt) and len(c.text) > len(prompt)
    assert len(c.logprobs.tokens) == n_prompt + 4
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert all(v <= 0 for v in c.logprobs.token_logprobs[1:])
    assert c.logprobs.text_offset[n_prompt] == len(prompt)


def test_text_offsets_count_characters_where_a_character_spans_several_tokens(client, engine):
    # An emoji the demo's tokenizer spells as byte tokens: those tokens start where the emoji does, and
    # the token after it one character later (offsets index the returned text, streamed or not).
    prompt = "the king\u2019s \U0001F984, then"
    ids = engine.tokenizer.encode(prompt)
    assert len(ids) > len(prompt.split())                          # the emoji takes several tokens
    for stream in (False, True):
        got = client.completions.create(model="demo", prompt=prompt, max_tokens=3, echo=True, logprobs=1,
                                        stream=stream, **GREEDY)
        chunks = list(got) if stream else [got]
        text = "".join(c.choices[0].text for c in chunks)
        offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
        tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        comma = tokens.index(",")
        assert offsets[comma] == text.index(",") == prompt.index(",")
        assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
        emoji = [o for t, o in zip(tokens, offsets) if t.startswith("bytes:")]
        assert emoji and set(emoji) == {prompt.index("\U0001F984")}


def test_echo_with_max_tokens_zero_only_scores_the_prompt(client, engine, loop):
    prompt = "Once upon a time"
    ids = engine.tokenizer.encode(prompt)
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    c = r.choices[0]
    assert c.text == prompt and r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    logits = loop.call(lambda e: e.score(ids)).result(30)                     # [T, V]
    expected = torch.log_softmax(logits[:-1].float(), dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1))
    assert c.logprobs.token_logprobs[0] is None
    assert c.logprobs.token_logprobs[1:] == pytest.approx(expected.squeeze(1).tolist(), abs=1e-5)
    # streamed: the same scores as events, the usage when asked for, then [DONE]
    chunks = list(client.completions.create(model="demo", prompt=prompt, max_tokens=0, echo=True, logprobs=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert [x.choices[0].text for x in chunks if x.choices] == [prompt]
    assert [x.choices[0].logprobs.token_logprobs for x in chunks if x.choices] == [c.logprobs.token_logprobs]
    assert chunks[-1].usage.prompt_tokens == len(ids) and chunks[-1].usage.completion_tokens == 0


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_each_get_their_own_index_and_tokens(client, stream):
    args = dict(model="demo", prompt="The sea", max_tokens=5, n=2, seed=1, temperature=1.0,
                extra_body={**IDS, "ignore_eos": True})
    if stream:
        chunks = list(client.completions.create(stream=True, **args))
        ids = {0: [], 1: []}
        for ch in chunks:
            for c in ch.choices:
                ids[c.index] += c.model_extra.get("token_ids", [])
    else:
        ids = {c.index: c.model_extra["token_ids"] for c in client.completions.create(**args).choices}
    assert sorted(ids) == [0, 1] and all(len(v) == 5 for v in ids.values())


def test_a_streamed_echo_starts_with_the_prompt_and_chunks_carry_their_tokens_logprobs(client):
    chunks = list(client.completions.create(model="demo", prompt="The sea", max_tokens=6, echo=True, logprobs=1,
                                            stream=True, temperature=0, extra_body={**IDS, "ignore_eos": True}))
    first = chunks[0].choices[0]
    assert first.text == "The sea" and first.logprobs.token_logprobs[0] is None
    later = [c.choices[0] for c in chunks[1:] if c.choices and c.choices[0].model_extra.get("token_ids")]
    assert sum(len(c.model_extra["token_ids"]) for c in later) == 6
    for c in later:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.model_extra["token_ids"])
    offsets = [o for c in later for o in c.logprobs.text_offset]
    assert offsets[0] == len("The sea") and offsets == sorted(offsets)


def _ids(engine, n: int) -> list[int]:
    """A prompt of exactly ``n`` token ids."""
    ids = engine.tokenizer.encode("the sea and the king " * n)
    assert len(ids) >= n
    return ids[:n]


def test_prompt_and_max_tokens_must_fit_the_context_and_the_refusal_names_what_fits(client, engine):
    ctx = engine.context_tokens
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt=_ids(engine, ctx - 132), max_tokens=200)
    assert err.value.body["param"] == "max_tokens" and err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["message"] == (f"max_tokens 200 does not fit: prompt has {ctx - 132} tokens, which leaves "
                                         f"132 of the {ctx}-token context for the reply; lower max_tokens to at most "
                                         "132 or shorten prompt by 68 tokens")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt=_ids(engine, ctx - 112), max_tokens=113)
    assert "lower max_tokens to at most 112 or shorten prompt by 1 token" in err.value.body["message"]
    full = client.completions.create(model="demo", prompt=_ids(engine, ctx - 112), max_tokens=112,
                                     extra_body={"ignore_eos": True})
    assert full.usage.completion_tokens == 112 and full.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt=_ids(engine, ctx), max_tokens=1)
    assert err.value.body["param"] == "prompt" and err.value.body["message"].endswith("shorten prompt by 1 token")


def test_echo_scores_a_prompt_that_fills_the_context_and_refuses_one_over_without_naming_max_tokens(client, engine):
    # max_tokens 0 generates nothing: the prompt needs only to fit, and a refusal blames no max_tokens
    ctx = engine.context_tokens
    r = client.completions.create(model="demo", prompt=_ids(engine, ctx), max_tokens=0, echo=True, logprobs=0)
    assert r.usage.prompt_tokens == ctx and len(r.choices[0].logprobs.token_logprobs) == ctx
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt=[[1, 2], _ids(engine, ctx + 3)], max_tokens=0, echo=True,
                                  logprobs=0)
    assert err.value.body["param"] == "prompt[1]" and err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["message"] == (f"prompt[1] has {ctx + 3} tokens, 3 over the {ctx}-token context; "
                                         "shorten it by 3 to score it")


def test_a_prompt_over_the_context_is_refused_with_a_fix_that_counts_the_asked_max_tokens(client, engine):
    # following the first refusal must be enough: naming only the prompt's own excess led to a second 400
    ctx = engine.context_tokens
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt=_ids(engine, ctx + 87), max_tokens=50)
    assert err.value.body["param"] == "prompt" and err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["message"] == (f"prompt and max_tokens are 137 tokens over the {ctx}-token context: prompt "
                                         f"has {ctx + 87} tokens and max_tokens asks for 50 more; shorten prompt by "
                                         "137 tokens, or by 88 tokens with max_tokens 1")
    fits = client.completions.create(model="demo", prompt=_ids(engine, ctx + 87 - 137), max_tokens=50,
                                     extra_body={"ignore_eos": True})
    assert fits.usage.completion_tokens == 50
    assert client.completions.create(model="demo", prompt=_ids(engine, ctx + 87 - 88), max_tokens=1).usage \
        .completion_tokens == 1
    with pytest.raises(openai.BadRequestError) as err:           # left out, max_tokens asks for nothing
        client.completions.create(model="demo", prompt=_ids(engine, ctx + 87))
    assert err.value.body["message"] == (f"prompt is 88 tokens over the {ctx}-token context: it has {ctx + 87} "
                                         "tokens and the reply needs at least 1; shorten it by 88 tokens")


def test_without_max_tokens_a_reply_takes_the_room_left_up_to_the_default(client, engine):
    ctx = engine.context_tokens
    roomy = client.completions.create(model="demo", prompt=_ids(engine, 20), extra_body={"ignore_eos": True})
    assert roomy.usage.completion_tokens == 16                         # OpenAI's default for completions
    tight = client.completions.create(model="demo", prompt=_ids(engine, ctx - 5), extra_body={"ignore_eos": True})
    assert tight.usage.completion_tokens == 5 and tight.choices[0].finish_reason == "length"


def test_response_format_constrains_a_completion_as_on_chat(client):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    r = client.completions.create(model="demo", prompt="Is the sea deep?", max_tokens=40, temperature=0,
                                  extra_body={"response_format": fmt, "ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].text)["answer"] in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="demo", prompt="Hi", extra_body={"response_format": {"type": "xml"}})
    assert err.value.body["param"] == "response_format.type"


@pytest.mark.parametrize("k", [0, 2])
def test_legacy_top_logprobs_hold_the_sampled_token_beside_the_top_k(client, k):
    r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=40, logprobs=k, temperature=2.0,
                                  seed=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    sizes = []
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert token in top and top[token] == pytest.approx(chosen)
        sizes.append(len(top))
    assert set(sizes) <= {k, k + 1} and k + 1 in sizes             # the sampled token outside the top k is added
    if k:
        assert k in sizes                                           # and not repeated when it is among them
