"""Guided decoding: output masked to a JSON schema, a regular expression or a Lark grammar, ended
when the grammar is complete; guides that do not compile are refused before anything is queued."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from engine import LLM
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ConfigError
from engine.guided import GUIDE_KINDS, Guide, GuideCompiler, GuideMatcher
from engine.sampling import SamplingParams

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
PROMPTS = ["And God said", "In the beginning", "The LORD is my shepherd"]

# a JSON schema with bounded fields: the demo model writes prose into strings without end otherwise
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "color"], "additionalProperties": False}
PERSON_GUIDE = Guide("json", json.dumps(PERSON))
NAME_RE = r"[A-Z][a-z]{2,8} (son|daughter) of [A-Z][a-z]{2,8}"


def follows_person(value: object) -> bool:
    """``value`` is valid against PERSON (a validator for exactly the keywords PERSON uses)."""
    if not isinstance(value, dict) or set(value) != {"name", "age", "color"}:
        return False
    name, age, color = value["name"], value["age"], value["color"]
    return (isinstance(name, str) and len(name) <= 12 and type(age) is int and 0 <= age <= 150
            and color in ("red", "green", "blue"))


@pytest.fixture(scope="module")
def engine():
    with LLMEngine(EngineConfig(model=str(DEMO), device="cpu")) as eng:
        yield eng


def run(eng: LLMEngine, jobs: dict[str, tuple[str, SamplingParams]]) -> dict[str, dict]:
    for rid, (prompt, params) in jobs.items():
        eng.add_request(rid, prompt, params)
    out = {rid: {"ids": [], "text": "", "logprobs": []} for rid in jobs}
    while eng.has_unfinished():
        for d in eng.step():
            o = out[d.request_id]
            o["ids"] += d.new_token_ids
            o["text"] += d.new_text
            o["logprobs"] += d.logprobs
            if d.finished:
                o["reason"], o["error"] = d.finish_reason, d.error
    return out


@pytest.mark.parametrize("params", [
    dict(temperature=0.0),
    dict(temperature=0.0, ignore_eos=True),               # the grammar's end still ends it
    dict(temperature=1.0, seed=5),
    dict(temperature=1.2, top_p=0.9, repetition_penalty=1.3, seed=11, ignore_eos=True),
])
def test_json_schema_output_parses_and_follows_the_schema(engine, params):
    jobs = {p: (p, SamplingParams(max_tokens=120, guide=PERSON_GUIDE, **params)) for p in PROMPTS}
    for rid, got in run(engine, jobs).items():
        assert got["reason"] == "stop", got
        assert follows_person(json.loads(got["text"])), got["text"]


def test_any_json_object_guide_gives_an_object(engine):
    got = run(engine, {"j": (PROMPTS[1], SamplingParams(max_tokens=120, temperature=0.0, guide=Guide("json", "")))})
    assert got["j"]["reason"] == "stop"
    assert isinstance(json.loads(got["j"]["text"]), dict)


def test_regex_guide_output_fullmatches(engine):
    for seed in (1, 2, 3):
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, guide=Guide("regex", NAME_RE))
        got = run(engine, {"r": (PROMPTS[0], params)})["r"]
        assert got["reason"] == "stop"
        assert re.fullmatch(NAME_RE, got["text"]), got["text"]


def test_an_end_token_the_grammar_allows_ends_the_request_even_with_ignore_eos(engine):
    """Once "Amen" is written the grammar is complete but could go on; the model's end-of-sequence
    token, which the grammar now allows, ends the request: ignore_eos cannot push past the grammar."""
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, guide=Guide("regex", "Amen(☃)?"))
    got = run(engine, {"e": (PROMPTS[0], params)})["e"]
    assert got["reason"] == "stop" and got["text"] == "Amen"
    assert got["ids"][-1] in engine.eos_ids      # in token_ids, never in the text


def test_lark_guide_picks_one_of_its_words(engine):
    yes_no = Guide("lark", 'start: "yes" | "no" | "maybe"')
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=4, guide=yes_no)
    got = run(engine, {"l": (PROMPTS[2], params)})["l"]
    assert got["reason"] == "stop" and got["text"] in ("yes", "no", "maybe")


def test_plain_rows_beside_guided_rows_are_unchanged(engine):
    """Rows with and without logprobs and guides in one batch: the plain rows make what they make alone."""
    greedy = dict(max_tokens=24, temperature=0.0, ignore_eos=True)
    jobs = {"plain": (PROMPTS[0], SamplingParams(**greedy)),
            "plain+lp": (PROMPTS[1], SamplingParams(**greedy, logprobs=3)),
            "json": (PROMPTS[2], SamplingParams(max_tokens=120, temperature=0.0, guide=PERSON_GUIDE)),
            "regex+lp": (PROMPTS[0], SamplingParams(max_tokens=60, temperature=0.0, logprobs=2,
                                                    guide=Guide("regex", NAME_RE))),
            "seeded": (PROMPTS[1], SamplingParams(max_tokens=24, temperature=1.0, seed=9, ignore_eos=True))}
    together = run(engine, jobs)
    for rid in ("plain", "plain+lp", "seeded"):
        assert together[rid]["ids"] == run(engine, {rid: jobs[rid]})[rid]["ids"]
    assert follows_person(json.loads(together["json"]["text"]))
    assert re.fullmatch(NAME_RE, together["regex+lp"]["text"])
    assert [lp.token_id for lp in together["regex+lp"]["logprobs"]] == together["regex+lp"]["ids"]
    assert len(together["plain+lp"]["logprobs"]) == 24 and together["plain"]["logprobs"] == []


def test_guided_output_survives_preemption_and_chunked_prefill(engine):
    """Blocks run out and requests are recomputed from their prompt and output; prompts are prefilled two
    tokens a step: each matcher stays where its output is, so the outputs equal an unhindered run's."""
    jobs = {f"{i}": (p, SamplingParams(max_tokens=50, temperature=0.0, guide=g))
            for i, (p, g) in enumerate([(PROMPTS[0], PERSON_GUIDE), (PROMPTS[1], PERSON_GUIDE),
                                        (PROMPTS[2], Guide("regex", NAME_RE)), (PROMPTS[0], Guide("json", ""))])}
    want = run(engine, jobs)
    bpt = 2 * 6 * 2 * 32 * 4                  # K and V * layers * kv heads * head_dim * fp32
    with LLM(str(DEMO), device="cpu", kv_block_size=4, kv_cache_size=bpt * 4 * 16, max_model_len=64,
             prefill_chunk=2, max_batch_tokens=4, max_batch=4) as small:
        got = run(small.engine, jobs)
        assert small.stats().preemptions > 0
    assert {r: g["ids"] for r, g in got.items()} == {r: w["ids"] for r, w in want.items()}
    assert follows_person(json.loads(got["0"]["text"])) and re.fullmatch(NAME_RE, got["2"]["text"])


@pytest.mark.parametrize("guide, message", [
    (Guide("json", '{"type": "objekt"}'), r"^the guide's JSON schema is invalid: .*objekt.*; fix the schema$"),
    (Guide("json", '{"type": "object", "properties": {'),
     r"^the guide's JSON schema is not valid JSON \(.*\); fix the schema$"),
    (Guide("json", "[1, 2]"), r"^the guide's JSON schema must be a JSON object \(got list\); fix the schema$"),
    (Guide("json", '{"type": "integer", "minimum": 5, "maximum": 1}', source="response_format"),
     r"^response_format's JSON schema is invalid: .*minimum.*; fix the schema$"),
    (Guide("json", '{"type": "object", "properties": {"a": {"not": {"type": "string"}}}}'),
     r'^the guide\'s JSON schema uses keywords that cannot be enforced \(Unimplemented keys: \["not"\]\); '
     r"remove them from the schema$"),
    (Guide("regex", "[a-z"),
     r"^the guide's regular expression is invalid: .*unclosed character class; fix the pattern$"),
    (Guide("lark", "start: missing_rule"), r"^the guide's Lark grammar is invalid: .*missing_rule.*; fix the grammar$"),
    # a grammar the library's check passes that fails on its first token: refused before it runs
    (Guide("json", '{"$ref": "#"}', source="response_format"), r"^response_format's JSON schema is invalid: "),
])
def test_a_guide_that_does_not_compile_is_one_line_and_queues_nothing(engine, guide, message):
    params = SamplingParams(guide=guide)
    with pytest.raises(ConfigError, match=message) as err:
        engine.validate_request(PROMPTS[0], params)
    assert "\n" not in str(err.value) and "<state>" not in str(err.value) and len(str(err.value)) < 600
    with pytest.raises(ConfigError, match=message):
        engine.add_request("bad", PROMPTS[0], params)
    assert not engine.has_unfinished() and not engine.scheduler.waiting
    assert run(engine, {"bad": (PROMPTS[0], SamplingParams(max_tokens=3))})["bad"]["reason"] == "length"


def test_a_model_without_a_tokenizer_cannot_take_a_guide():
    from engine.checkpoint.reader import SafetensorsReader
    from engine.checkpoint.spec import read_spec
    from engine.loading import LoadedModel
    config = EngineConfig(model=str(DEMO), device="cpu")
    with LLMEngine(config, LoadedModel(config, read_spec(DEMO), SafetensorsReader(DEMO), None)) as eng:
        with pytest.raises(ConfigError, match=r"^this model has no tokenizer, so its output cannot follow a guide "
                                              r"\(.*\); load a model folder with a tokenizer.json, or drop the guide$"):
            eng.add_request("g", [1, 5, 9], SamplingParams(guide=Guide("regex", "a+")))
        assert not eng.has_unfinished()
        got = run(eng, {"p": ([1, 5, 9], SamplingParams(max_tokens=2, logprobs=1))})   # logprobs need no tokenizer
        assert len(got["p"]["logprobs"]) == 2


class Breaks:
    """An llguidance matcher that enters its error state on its ``at``-th token or mask, as one whose
    parser hits a resource limit does (its message has several lines)."""

    def __init__(self, real, at: int, on: str) -> None:
        self.real, self.at, self.on, self.count, self.broken = real, at, on, 0, False

    def _tick(self, what: str) -> bool:
        self.count += what == self.on
        self.broken = self.broken or self.count >= self.at
        return self.broken

    def consume_token(self, token: int) -> bool:
        return not self._tick("token") and self.real.consume_token(token)

    def unsafe_compute_mask_ptr(self, ptr: int, size: int) -> None:
        if not self._tick("mask"):
            self.real.unsafe_compute_mask_ptr(ptr, size)

    def is_error(self) -> bool:
        return self.broken

    def get_error(self) -> str:
        return "parser too complex:\n  row items above the limit (2000)\n" if self.broken else ""

    def is_stopped(self) -> bool:
        return self.broken or self.real.is_stopped()


@pytest.mark.parametrize("on, at, kept", [("token", 3, 3), ("mask", 4, 3), ("mask", 1, 0)])
def test_a_guide_that_fails_mid_output_ends_only_its_request_with_one_line(engine, monkeypatch, on, at, kept):
    """A failed consume keeps the token it could not take; a failed mask voids the token drawn with it."""
    real = GuideCompiler.matcher
    monkeypatch.setattr(GuideCompiler, "matcher",
                        lambda self, guide: GuideMatcher(Breaks(real(self, guide)._m, at, on)))
    jobs = {"guided": (PROMPTS[0], SamplingParams(max_tokens=60, temperature=0.0, guide=Guide("regex", NAME_RE))),
            "plain": (PROMPTS[1], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))}
    got = run(engine, jobs)
    assert got["guided"]["reason"] == "error"
    assert got["guided"]["error"] == ("the output could not follow its guide: parser too complex: row items above the "
                                      "limit (2000)")
    assert len(got["guided"]["ids"]) == kept
    assert got["plain"]["reason"] == "length" and len(got["plain"]["ids"]) == 10
    assert not engine.has_unfinished() and engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="xml"), r"^a guide's kind must be one of json, regex, lark \(got 'xml'\)$"),
    (dict(kind="json", spec={"type": "object"}), r"^a guide's spec must be text \(got dict\); "),
])
def test_guides_check_their_fields(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Guide(**kwargs)
    assert GUIDE_KINDS == ("json", "regex", "lark")


@pytest.mark.parametrize("value", ["json", {"kind": "json"}, ("regex", "a+")])
def test_sampling_params_take_only_a_guide(value):
    with pytest.raises(ConfigError, match=r"^guide must be a Guide from engine.guided or None \(got \w+\); "
                                          r"build one with Guide\(kind, spec\)$"):
        SamplingParams(guide=value)
    assert SamplingParams(guide=Guide("regex", "a+")).guide == Guide("regex", "a+")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pool", [None, "50%"])
def test_guides_and_logprobs_on_replayed_cuda_graphs(pool):
    """Decode steps replayed from CUDA graphs (whole, and with half the experts offloaded) mask and
    report logprobs as eager steps do: the same tokens and logprobs, and those of the scored logits."""
    jobs = {"json": (PROMPTS[0], SamplingParams(max_tokens=60, temperature=0.0, guide=PERSON_GUIDE, logprobs=4)),
            "regex": (PROMPTS[1], SamplingParams(max_tokens=60, temperature=1.0, seed=3,
                                                 guide=Guide("regex", NAME_RE))),
            "plain+lp": (PROMPTS[2], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)),
            "plain": (PROMPTS[0], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))}
    outs, scored = {}, {}
    for graphs in (False, True):
        with LLM(str(DEMO), device="cuda", dtype="float32", cuda_graphs=graphs, expert_pool_size=pool) as llm:
            outs[graphs] = run(llm.engine, jobs)
            if graphs:
                assert llm.engine.runner.graphs.replays > 0
            for rid in ("json", "plain+lp"):
                prompt = llm.tokenizer.encode(jobs[rid][0])
                logits = llm.engine.score(prompt + outs[graphs][rid]["ids"][:-1])[len(prompt) - 1:]
                scored[graphs, rid] = logits.float().log_softmax(dim=-1)
    assert {r: o["ids"] for r, o in outs[True].items()} == {r: o["ids"] for r, o in outs[False].items()}
    for rid in ("json", "plain+lp"):
        eager, replayed = outs[False][rid]["logprobs"], outs[True][rid]["logprobs"]
        assert [lp.token_id for lp in replayed] == outs[True][rid]["ids"]
        for k, (a, b) in enumerate(zip(eager, replayed)):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]
            # fp32 matmuls in the GPU kernels round through tf32: decode and prefill logits differ by ~1e-2,
            # far less than a mask or a temperature would move them
            assert b.logprob == pytest.approx(scored[True, rid][k, b.token_id].item(), abs=0.05)
    assert follows_person(json.loads(outs[True]["json"]["text"]))
    assert re.fullmatch(NAME_RE, outs[True]["regex"]["text"])


def test_a_guide_that_fails_part_way_ends_its_request_with_one_short_line(engine):
    # an endlessly nested schema passes every check and fails once the nesting grows too large: the
    # request ends with the library's reason, without its parser state or grammar dumps
    from engine.guided import one_line
    line = one_line('parser error: Too many items (limit 50000) <state> Tokens: x\ny </state><grammar> {"a": 1}'
                    ' </grammar> more')
    assert line == "parser error: Too many items (limit 50000) more"
