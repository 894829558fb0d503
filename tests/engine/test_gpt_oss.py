"""gpt-oss as data on the generic model: its config fields, its checkpoint's tensors, and logits and
greedy tokens against transformers' implementation with prompts longer than the sliding window,
chunked prefill and several sequences in one batch."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.checkpoint.loader import check_complete
from engine.checkpoint.memory import DictSource
from engine.checkpoint.plan import active_params_per_token, params_by_category
from engine.checkpoint.spec import spec_from_config
from engine.errors import ModelLoadError, UnsupportedModelError
from test_parity import assert_logits_match
from tiny_models import build_tiny_model

WINDOW = 8                       # the tiny config's sliding window (layers 0 and 2; layer 1 is full)
_gen = torch.Generator().manual_seed(7)
# a prompt five windows long, one shorter than a window, one between
PROMPTS = [[1] + torch.randint(4, 500, (39,), generator=_gen).tolist(), [1, 99, 4],
           [1] + torch.randint(4, 500, (20,), generator=_gen).tolist()]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoModelForCausalLM
    path = build_tiny_model(tmp_path_factory.mktemp("gpt_oss") / "m", "gpt_oss")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    # prefill_chunk 5 and a budget of 8 tokens: every long prompt is split over several steps
    llm = LLM(str(path), device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4)
    yield path, hf, llm
    llm.close()


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_without_layer_types_the_even_layers_slide_as_transformers_fills_them_in(pair):
    # transformers' GptOssConfig: layer_types left out -> sliding on even layers, full on odd ones,
    # over sliding_window (128 when that is left out too)
    from transformers import GptOssConfig
    path = pair[0]
    cfg = {k: v for k, v in _config(path).items() if k != "layer_types"}
    want = GptOssConfig(**cfg).layer_types
    assert want == ["sliding_attention", "full_attention", "sliding_attention"]
    assert spec_from_config(cfg, path).layer_windows == (WINDOW, 0, WINDOW)
    no_window = {k: v for k, v in cfg.items() if k != "sliding_window"}
    assert GptOssConfig(**no_window).sliding_window == 128
    assert spec_from_config(no_window, path).layer_windows == (128, 0, 128)


def test_spec_reads_the_family_fields(pair):
    path, _, llm = pair
    spec = llm.engine.loaded.spec
    assert spec.architecture == "GptOssForCausalLM" and spec.family.name == "gpt_oss"
    assert spec.layer_windows == (WINDOW, 0, WINDOW) and [spec.window(i) for i in range(3)] == [8, 0, 8]
    y = spec.rope_scaling
    assert (y.kind, y.factor, y.original_max_position, y.beta_fast, y.beta_slow, y.truncate) == \
        ("yarn", 8.0, 64, 32.0, 1.0, False)
    assert spec.rope_theta == 150000.0 and y.attention_factor is None
    assert spec.qkv_bias and spec.o_bias and spec.renormalize
    assert (spec.swiglu_alpha, spec.swiglu_limit, spec.expert_storage) == (1.702, 7.0, "dense")
    mxfp4 = spec_from_config({**_config(path), "quantization_config": {"quant_method": "mxfp4"}}, path)
    assert mxfp4.expert_storage == "mxfp4"
    # the older spelling: rope_scaling with "type", rope_theta at the top level
    old = {**_config(path), "rope_theta": 5e5, "rope_parameters": None,
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}}
    o = spec_from_config(old, path)
    assert o.rope_theta == 5e5 and (o.rope_scaling.factor, o.rope_scaling.truncate) == (4.0, True)


def test_resident_weights_carry_biases_sinks_and_windows(pair):
    _, hf, llm = pair
    w = llm.engine.loaded.weights
    for i, layer in enumerate(w.layers):
        ref = hf.model.layers[i]
        assert layer.attn.sinks.dtype == torch.float32
        assert torch.equal(layer.attn.sinks, ref.self_attn.sinks)
        assert torch.equal(layer.attn.o_bias, ref.self_attn.o_proj.bias)
        assert torch.equal(layer.moe.router_bias, ref.mlp.router.bias)
        assert layer.attn.window == (WINDOW if i != 1 else 0)


def test_parameter_counts_match_transformers(pair):
    _, hf, llm = pair
    spec = llm.engine.loaded.spec
    counts = params_by_category(spec)
    assert sum(counts.values()) == sum(p.numel() for p in hf.parameters())
    experts = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    assert counts["routed_experts"] == experts
    per_expert = experts // (spec.num_layers * spec.num_experts)
    everything_else = sum(counts.values()) - experts - spec.vocab_size * spec.hidden + spec.hidden
    assert active_params_per_token(spec) == everything_else + spec.num_layers * spec.top_k * per_expert


def test_batched_logits_match_transformers(pair):
    _, hf, llm = pair
    assert_logits_match(hf, llm, PROMPTS)          # prompts up to five windows long, chunked prefill


def test_greedy_generation_matches_transformers(pair):
    _, hf, llm = pair
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    batched = llm.generate(PROMPTS, params)
    for ids, out in zip(PROMPTS, batched):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                              use_cache=True)[0, len(ids):].tolist()
        assert out.token_ids == ref
    assert llm.generate([PROMPTS[0]], params)[0].token_ids == batched[0].token_ids


def test_state_dict_in_memory_and_its_shape_checks(pair):
    """transformers' own state_dict runs without a disk; a mis-shaped fused expert tensor or a missing
    sink is refused in one line before anything is allocated."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.loading import LoadedModel
    path, hf, _ = pair
    spec = spec_from_config(_config(path), Path("memory"))
    state = dict(hf.state_dict())
    config = EngineConfig(model="memory", device="cpu", dtype="float32")
    engine = LLMEngine(config, LoadedModel(config, spec, DictSource(state), None))
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPTS[0]])).logits[0].float()
    assert (engine.score(PROMPTS[0]) - ref).abs().max().item() <= 1e-4
    gu = "model.layers.1.mlp.experts.gate_up_proj"
    cases = [({gu: state[gu][:, :, :32]}, f"tensor '{gu}' has shape [4, 64, 32] but config.json implies [4, 64, 64]"),
             ({gu + "_bias": state[gu + "_bias"][:, :32]}, "has shape [4, 32] but config.json implies [4, 64]"),
             ({"model.layers.2.self_attn.sinks": None}, "'model.layers.2.self_attn.sinks' (shape [4]) is missing")]
    for bad, says in cases:
        broken = {k: v for k, v in {**state, **bad}.items() if v is not None}
        with pytest.raises(ModelLoadError) as info:
            check_complete(spec, DictSource(broken))
        assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("changes,error,says", [
    ({"layer_types": ["sliding_attention", "full_attention"]}, ModelLoadError,
     "field 'layer_types' is [\"sliding_attention\", \"full_attention\"] but must be a list of 3 entries"),
    ({"layer_types": ["sliding_attention", "full_attention", "chunked_attention"]}, ModelLoadError,
     '"sliding_attention" or "full_attention"'),
    ({"layer_types": "sliding_attention"}, ModelLoadError, "must be a list of strings"),
    ({"sliding_window": 0}, ModelLoadError, "field 'sliding_window' is 0 but must be a positive integer"),
    ({"sliding_window": None}, ModelLoadError, "field 'sliding_window' is null but must be a positive integer"),
    ({"sliding_window": 4.5}, ModelLoadError, "field 'sliding_window' is 4.5"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, UnsupportedModelError,
     "rope scaling type 'longrope' is not supported; supported: default (no scaling), yarn"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": -2.0}}, ModelLoadError,
     "field 'rope_parameters.factor' is -2.0 but must be a finite number above 0"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "truncate": "no"}}, ModelLoadError,
     "field 'rope_parameters.truncate' is \"no\" but must be true or false"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, UnsupportedModelError,
     "quantization_config.quant_method 'gptq' is not supported"),
    ({"swiglu_limit": -1}, ModelLoadError, "field 'swiglu_limit' is -1"),
])
def test_bad_family_fields_are_one_line(pair, changes, error, says):
    path = pair[0]
    with pytest.raises(error) as info:
        spec_from_config({**_config(path), **changes}, path)
    msg = str(info.value)
    assert says in msg and "\n" not in msg


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors through the Triton interpreter")
@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_cuda_kernels_path_matches_torch_path(pair, kv):
    """On CUDA gpt-oss runs the add + RMSNorm, q/k RoPE + KV write (qkv bias, YaRN-scaled tables) and
    router kernels as the other families do, and its sinks and windows go to the paged prefill and
    split-KV decode kernels (an int8 cache with its scales too); here all of them are switched on by hand."""
    pytest.importorskip("triton")
    from kernels.paged_attention import paged_decode_attention
    from kernels.prefill_attention import prefill_attention
    prompts = [PROMPTS[0][:11], PROMPTS[1]]          # one prompt past the window, split in chunks of 5
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    with LLM(str(pair[0]), device="cpu", dtype="float32", prefill_chunk=5, max_batch_tokens=8, max_batch=4,
             kv_cache_dtype=kv) as llm:
        model = llm.engine.loaded.model
        ref = llm.engine.score_batch(prompts)
        ref_tokens = [o.token_ids for o in llm.generate(prompts, greedy)]
        calls = {"prefill": 0, "decode": 0}

        def counted(kind, fn):
            def run(*args, **kwargs):
                calls[kind] += 1
                return fn(*args, **kwargs)
            return run
        model.fused = True
        model.prefill_attention = counted("prefill", prefill_attention)
        model.decode_attention = counted("decode", paged_decode_attention)
        got = llm.engine.score_batch(prompts)
        tokens = [o.token_ids for o in llm.generate(prompts, greedy)]
    assert calls["prefill"] > 0 and calls["decode"] > 0
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    assert tokens == ref_tokens


@pytest.mark.parametrize("fmt,floor", [("bf16", 0.9999), ("fp8", 0.995), ("int4", 0.95), ("mxfp4", 0.95)])
def test_experts_quantised_at_load_keep_the_model(pair, fmt, floor):
    """The fused, interleaved fp32 experts (with their biases) packed as bf16 / fp8 / int4 / MXFP4:
    logits stay close to the fp32 ones (all experts resident, the reference MoE path)."""
    path, _, llm = pair
    ref = llm.engine.score_batch(PROMPTS[:1])[0]
    with LLM(str(path), device="cpu", dtype="float32", weight_format=fmt, group_size=32) as q:
        assert q.engine.loaded.layout.fmt == fmt and q.engine.loaded.layout.bias
        got = q.engine.score_batch(PROMPTS[:1])[0]
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item() >= floor
