"""Tiny random MoE checkpoints of every supported family, saved with transformers' save_pretrained.

Each family gets a config that exercises its quirks: GQA, q/k norm, qkv bias, a shared expert,
dense layers between sparse ones, top-k renormalisation, tied embeddings, and gpt-oss's sinks,
sliding windows, YaRN and biased experts.
"""
from __future__ import annotations

from pathlib import Path

import torch

from tests.engine.tokenizer_fixtures import build_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 512


def _common(**over) -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=3, pad_token_id=0)
    base.update(over)
    return base


def family_configs() -> dict:
    """name -> transformers config of a tiny model of that family."""
    from transformers import (DeepseekV2Config, DeepseekV3Config, Glm4MoeConfig, GptOssConfig, MixtralConfig,
                              OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig)
    latent = dict(num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, moe_intermediate_size=32,
                  n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1)
    return {
        "mixtral": MixtralConfig(**_common(num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6)),
        # shared expert + sigmoid gate, qkv bias, a dense layer between sparse ones (step 2 + mlp_only)
        "qwen2_moe": Qwen2MoeConfig(**_common(moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                              num_experts=6, num_experts_per_tok=2, decoder_sparse_step=1,
                                              mlp_only_layers=[1], norm_topk_prob=False)),
        # per-head q/k norm, explicit head_dim, renormalised top-k, tied embeddings
        "qwen3_moe": Qwen3MoeConfig(**_common(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                              head_dim=24, norm_topk_prob=True, tie_word_embeddings=True)),
        # q/k norm over the whole projection; top-k = 1
        "olmoe": OlmoeConfig(**_common(intermediate_size=32, num_experts=4, num_experts_per_tok=1)),
        # q/k/v/o biases, sinks, sliding (window 8) and full layers, YaRN, router bias, clamped SwiGLU
        # experts with biases, fused and interleaved; explicit head_dim; YaRN as gpt-oss ships it (not
        # truncated) over a context of 64 x 8 = max_position_embeddings, so dimension 1 is blended
        "gpt_oss": GptOssConfig(**_common(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                          head_dim=16, sliding_window=8, rms_norm_eps=1e-5,
                                          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                          rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                                           "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                           "original_max_position_embeddings": 64})),
        # GLM-4.5: RoPE on half of each head, per-head q/k norm, q/k/v biases, sigmoid router scores
        # chosen with a correction bias and scaled by 2.5, a shared expert without a gate, the first
        # layer dense
        "glm4_moe": Glm4MoeConfig(**_common(moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                                            n_shared_experts=1, first_k_dense_replace=1, head_dim=16,
                                            partial_rotary_factor=0.5, n_group=1, topk_group=1,
                                            routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=True,
                                            use_qk_norm=True, rms_norm_eps=1e-5)),
        # DeepSeek-V2(-Lite): latent attention with queries straight from the hidden state, interleaved
        # rotary pairs, softmax scores in the best 2 of 4 expert groups (group max), scaled by 1.5 and
        # not renormalised, a shared expert, the first layer dense; YaRN with DeepSeek's mscale_all_dim
        # (the softmax scale grows with it) over a context of 64 x 8
        "deepseek_v2": DeepseekV2Config(**_common(**latent, topk_method="group_limited_greedy", n_group=4,
                                                  topk_group=2, routed_scaling_factor=1.5, norm_topk_prob=False,
                                                  rope_parameters={"rope_type": "yarn", "factor": 8.0,
                                                                   "original_max_position_embeddings": 64,
                                                                   "beta_fast": 32.0, "beta_slow": 1.0,
                                                                   "mscale": 0.707, "mscale_all_dim": 0.707,
                                                                   "rope_theta": 10000.0})),
        # DeepSeek-V3: low-rank queries, sigmoid scores chosen with a correction bias in the best 2 of 4
        # groups (each scored by its two best), renormalised and scaled by 2.5
        "deepseek_v3": DeepseekV3Config(**_common(**latent, q_lora_rank=48, n_group=4, topk_group=2,
                                                  routed_scaling_factor=2.5, norm_topk_prob=True)),
    }


def build_tiny_model(path: Path, family: str = "qwen3_moe", seed: int = 0, dtype=torch.float32,
                     wide: bool = False, **changes) -> Path:
    """Write a random tiny model of ``family`` with a tokenizer into ``path``; returns ``path``.

    ``wide``: hidden size and expert FFN of 128, so every int4 group size divides them. ``changes``:
    config fields to set (e.g. ``rope_parameters``), given to the config's constructor.
    """
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = family_configs()[family]
    if changes:
        cfg = type(cfg).from_dict({**cfg.to_dict(), **changes})
    if wide:
        cfg.hidden_size, cfg.moe_intermediate_size, cfg.intermediate_size = 128, 128, 128
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    _spread_init(model)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    build_tiny_tokenizer(path, vocab_size=VOCAB)
    return path


def _spread_init(model) -> None:
    """Larger random weights than the default init, so routing and logits actually vary (attention
    sinks of about one logit, so a head's weight on nothing is large enough to matter)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):      # GLM: a choice bias that changes choices
                b.normal_(0.0, 0.05)


# A Hermes-style tool template (the syntax Qwen3 templates teach): tools listed in the system
# turn, calls as <tool_call> blocks, results as <tool_response> blocks in a user turn.
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- 'Functions you may call:\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}"
    "{{- '</tools>\\nCall one by answering <tool_call>\\n{\"name\": <its name>, \"arguments\": <a JSON object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role != 'system' %}"
    "{{- raise_exception('Unknown role: ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")


def build_tiny_tools_model(path: Path, family: str = "qwen3_moe", seed: int = 0) -> Path:
    """:func:`build_tiny_model` with a chat template that renders tools (:data:`TOOLS_CHAT_TEMPLATE`).

    ``<tool_call>`` and ``</tool_call>`` are single ordinary (not special) tokens, as in Qwen's
    tokenizers, so decoding keeps them in the reply text. The context is 2048 tokens: a prompt that
    lists tools with their schemas is long in a byte-level vocabulary of 512.
    """
    import json

    build_tiny_model(path, family, seed)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = 2048         # rotary positions: nothing learned depends on it
    (path / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return add_chat_tokens(path, TOOL_CALL_TOKENS, TOOLS_CHAT_TEMPLATE)


def add_chat_tokens(path: Path, tokens: tuple[str, ...], template: str) -> Path:
    """Add ``tokens`` to the tiny tokenizer in ``path`` as single ordinary (not special) tokens, as
    Qwen's tokenizers have them (decoding keeps them in the text), and make ``template`` its chat template."""
    import json

    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tokens])
    if tok.get_vocab_size(with_added_tokens=True) > VOCAB:
        raise ValueError(f"the tiny tokenizer outgrew the model's {VOCAB} embeddings")
    tok.save(str(path / "tokenizer.json"))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return path


# Qwen3's way of writing reasoning: the reply opens with <think>, and a turn that must not think has an
# empty block put in its generation prompt (enable_thinking false), so that reply starts after it.
THINK_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
THINK_TOKENS = ("<think>", "</think>")


def build_tiny_think_model(path: Path, family: str = "qwen3_moe", seed: int = 0) -> Path:
    """:func:`build_tiny_model` whose vocabulary has ``<think>`` and ``</think>`` as single ordinary
    tokens and whose chat template writes them (:data:`THINK_CHAT_TEMPLATE`), as Qwen3's and GLM-4.5's."""
    build_tiny_model(path, family, seed)
    return add_chat_tokens(path, THINK_TOKENS, THINK_CHAT_TEMPLATE)
