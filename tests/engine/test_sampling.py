"""The batched sampler, seeded generators and stop-string helpers."""
from __future__ import annotations

import pytest
import torch

from engine.sampling import (SamplingParams, apply_repetition_penalty, check_stop, make_generator, sample,
                             stop_holdback, warp_logits)

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
    TopPLogitsWarper,
)

GREEDY = SamplingParams(temperature=0.0)


def _logits(rows: int, vocab: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3  # [B, V]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype: torch.dtype) -> None:
    logits = _logits(8).to(dtype)
    out = sample(logits, [GREEDY] * 8, [None] * 8, None)
    assert out.dtype == torch.int64
    assert torch.equal(out, logits.float().argmax(dim=-1))


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = _logits(6)
    params = ([SamplingParams(temperature=1.5, top_k=1)] * 3
              + [SamplingParams(temperature=1.5, top_p=1e-6)] * 3)
    for seed in range(5):
        gens = [make_generator(seed * 10 + i, "cpu") for i in range(6)]
        assert torch.equal(sample(logits, params, gens, None), logits.argmax(dim=-1))


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324, 9e-6])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature: float) -> None:
    # 1e-40 is 0 in float32: dividing the logits by it made every logit inf or nan and picked token 0
    logits = _logits(3)
    params = [SamplingParams(temperature=temperature, seed=1)] * 3
    assert params[0].greedy and not SamplingParams(temperature=1e-5).greedy
    out = sample(logits, params, [make_generator(1 + i, "cpu") for i in range(3)], None)
    assert torch.equal(out, logits.argmax(dim=-1))


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = _logits(4)
    params = [GREEDY, SamplingParams(top_k=1), GREEDY, SamplingParams(temperature=0.7, seed=3)]
    out = sample(logits, params, [None, None, None, make_generator(3, "cpu")], None)
    assert torch.equal(out[:3], logits[:3].argmax(dim=-1))


def test_min_p_filters_unlikely_tokens() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))                         # [1, 4]
    warped = warp_logits(logits, [SamplingParams(min_p=0.2)])
    assert torch.isfinite(warped).tolist() == [[True, True, True, False]]  # 0.05 < 0.2 * 0.5
    params = [SamplingParams(min_p=0.35)] * 2000
    out = sample(logits.expand(2000, 4), params, [make_generator(7, "cpu")] * 2000, None)
    assert set(out.tolist()) == {0, 1}  # 0.15 < 0.35 * 0.5 is removed too


@pytest.mark.parametrize("top_k,top_p,min_p,temperature", [
    (0, 0.9, 0.0, 1.0), (5, 1.0, 0.0, 0.7), (10, 0.8, 0.05, 1.3), (0, 1.0, 0.1, 0.5), (3, 0.5, 0.2, 2.0),
])
def test_filters_match_transformers(top_k: int, top_p: float, min_p: float, temperature: float) -> None:
    logits = _logits(5, vocab=100, seed=1)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ours = warp_logits(logits, [params] * 5)
    theirs = TemperatureLogitsWarper(temperature)(None, logits.clone())
    for warper, on in ((TopKLogitsWarper(max(top_k, 1)), top_k > 0), (TopPLogitsWarper(top_p), top_p < 1),
                       (MinPLogitsWarper(min_p), min_p > 0)):
        theirs = warper(None, theirs) if on else theirs
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(ours.softmax(-1), theirs.softmax(-1))


def test_without_filters_the_logits_are_only_scaled_and_rows_with_filters_still_filter() -> None:
    # No top-k, top-p or min-p (or a top-k of the whole vocabulary): nothing is sorted, and the
    # result is what the sorting path gives, bit for bit.
    logits = _logits(3, vocab=100, seed=2)
    plain = [SamplingParams(temperature=t) for t in (0.7, 1.0)] + [SamplingParams(temperature=1.3, top_k=100)]
    fast = warp_logits(logits, plain)
    torch.testing.assert_close(fast, logits / torch.tensor([[0.7], [1.0], [1.3]]), rtol=0, atol=0)
    sorted_path = warp_logits(torch.cat([logits, logits[:1]]), plain + [SamplingParams(top_p=0.5)])
    assert torch.equal(sorted_path[:3], fast)
    assert torch.isinf(sorted_path[3]).any() and torch.isfinite(fast).all()


def test_repetition_penalty_matches_transformers() -> None:
    logits = _logits(3, vocab=50)
    histories = [[1, 5, 5, 7, 49], [], [0, 2, 3, 2]]
    penalties = [1.3, 1.3, 0.8]
    ours = apply_repetition_penalty(logits, penalties, histories)
    for row in (0, 2):
        ids = torch.tensor([histories[row]])
        theirs = RepetitionPenaltyLogitsProcessor(penalties[row])(ids, logits[row:row + 1].clone())
        torch.testing.assert_close(ours[row:row + 1], theirs, rtol=0, atol=0)
    assert torch.equal(ours[1], logits[1])
    assert not torch.equal(ours[0], logits[0])  # the caller's tensor is left alone, a new one returned


def test_repetition_penalty_changes_greedy_choice() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.2)]
    assert sample(logits, params, [None], [[0]]).item() == 1     # 2.0 / 1.2 < 1.9
    assert sample(logits, params, [None], [[]]).item() == 0
    assert sample(logits, [GREEDY], [None], [[0]]).item() == 0  # penalty 1.0 is off


def test_same_seed_same_tokens_regardless_of_batch() -> None:
    vocab = 200
    target = _logits(1, vocab, seed=5)                                                  # [1, V]
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)

    def run_alone() -> list[int]:
        gen = make_generator(1234, "cpu")
        return [sample(target, [params], [gen], None).item() for _ in range(20)]

    def run_in_batch(others: int) -> list[int]:
        gen = make_generator(1234, "cpu")
        other_gens = [make_generator(s, "cpu") for s in range(others)]
        batch = torch.cat([_logits(others, vocab, seed=9), target])                   # [others + 1, V]
        mix = [SamplingParams(temperature=0.8, top_k=7)] * others + [params]
        return [sample(batch, mix, other_gens + [gen], None)[-1].item() for _ in range(20)]

    alone = run_alone()
    assert alone == run_alone() == run_in_batch(1) == run_in_batch(5)
    assert len(set(alone)) > 3  # it really sampled rather than always taking the argmax


def test_unseeded_generator_is_none() -> None:
    assert make_generator(None, "cpu") is None
    assert make_generator(0, "cpu").initial_seed() == 0


def test_temperature_frequencies_follow_softmax() -> None:
    logits = torch.tensor([[1.0, 0.0, -0.5, 0.5, -2.0]])                               # [1, 5]
    n, temperature = 20000, 0.8
    gen = make_generator(42, "cpu")
    out = sample(logits.expand(n, 5), [SamplingParams(temperature=temperature)] * n, [gen] * n, None)
    freq = torch.bincount(out, minlength=5).float() / n
    expected = (logits[0] / temperature).softmax(-1)
    assert (freq - expected).abs().max().item() < 0.015


def test_check_stop_finds_straddling_strings() -> None:
    assert check_stop("Hello wo", "rld!", ("world",)) == 6
    assert check_stop("abc", "def", ("zz",)) is None
    assert check_stop("x STO", "P and END", ("END", "STOP")) == 2       # the earliest one wins
    assert check_stop("", "one\n\ntwo", ("\n\n",)) == 3
    assert check_stop("world ", "again", ("world",)) is None            # already reported earlier
    assert check_stop("ab", "c", ("",)) is None


def test_stop_holdback() -> None:
    assert stop_holdback("Hello wor", ("world",)) == 3
    assert stop_holdback("Hello w", ("world", "wxyz")) == 1
    assert stop_holdback("Hello", ("world",)) == 0
    assert stop_holdback("a<|i", ("<|im_end|>", "<")) == 3
    assert stop_holdback("abc<", ("<",)) == 0                            # a full match is check_stop's job
    assert stop_holdback("", ("world",)) == 0


@pytest.mark.parametrize("field, value, match", [
    ("max_tokens", 0, r"max_tokens must be a whole number >= 1 \(got 0\)"),
    ("max_tokens", "5", r"max_tokens must be a whole number >= 1 \(got '5'\)"),
    ("max_tokens", 2.5, r"max_tokens must be a whole number >= 1 \(got 2.5\)"),
    ("max_tokens", None, r"max_tokens must be a whole number >= 1 \(got None\)"),
    ("temperature", -0.1, r"temperature must be a number >= 0 \(got -0.1\); 0 is greedy"),
    ("temperature", float("nan"), r"temperature must be a number >= 0 \(got nan\)"),
    ("temperature", float("inf"), r"temperature must be a number >= 0 \(got inf\)"),
    ("temperature", "hot", r"temperature must be a number >= 0 \(got 'hot'\)"),
    ("top_p", 0.0, r"top_p must be a number in \(0, 1\] \(got 0.0\); 1 turns it off"),
    ("top_p", 1.5, r"top_p must be a number in \(0, 1\]"),
    ("top_k", -1, r"top_k must be a whole number >= 0 \(got -1\); 0 turns it off"),
    ("top_k", True, r"top_k must be a whole number >= 0 \(got True\)"),
    ("min_p", 1.0, r"min_p must be a number in \[0, 1\) \(got 1.0\)"),
    ("repetition_penalty", 0, r"repetition_penalty must be a number > 0 \(got 0\)"),
    ("repetition_penalty", float("nan"), r"repetition_penalty must be a number > 0 \(got nan\)"),
    ("seed", "42", r"seed must be a whole number that fits in 64 bits \(got '42'\)"),
    ("seed", 2 ** 64, r"seed must be a whole number that fits in 64 bits"),
    ("stop", 5, r"stop must be a string or a list of strings \(got 5\)"),
    ("stop", ["END", 3], r"stop must be a string or a list of strings"),
    ("stop", ["END", ""], r"stop strings must not be empty"),
    ("stop_token_ids", [-1], r"stop_token_ids must be a list of token ids >= 0 \(got \[-1\]\)"),
    ("stop_token_ids", "12", r"stop_token_ids must be a list of token ids >= 0"),
    ("stop_token_ids", [1.0], r"stop_token_ids must be a list of token ids >= 0"),
    ("ignore_eos", "yes", r"ignore_eos must be True or False \(got 'yes'\)"),
    ("include_stop_str_in_output", 1, r"include_stop_str_in_output must be True or False"),
])
def test_every_field_is_checked_with_a_one_line_config_error(field, value, match) -> None:
    from engine.errors import ConfigError
    with pytest.raises(ConfigError, match=match) as err:
        SamplingParams(**{field: value})
    assert "\n" not in str(err.value)


def test_accepted_values_are_normalised() -> None:
    import numpy as np
    p = SamplingParams(max_tokens=np.int64(7), temperature=np.float32(0.5), top_k=np.int32(3), seed=-5,
                       stop="END", stop_token_ids=[np.int64(2)])
    assert (type(p.max_tokens), type(p.temperature), type(p.top_k)) == (int, float, int)
    assert p.stop == ("END",) and p.stop_token_ids == (2,) and p.seed == -5
    assert SamplingParams(stop=None, stop_token_ids=None).stop == ()
    assert SamplingParams(temperature=0).greedy
