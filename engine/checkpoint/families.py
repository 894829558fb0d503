"""Per-family data: tensor names and the few flags in which the supported MoE families differ.

One generic model (engine/models) runs them all; nothing here is code that differs by family.
Name templates use ``{i}`` for the layer and ``{e}`` for the expert.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    moe_prefix: str          # module holding the router and the experts
    router: str              # router weight [E, D]
    expert_gate: str         # per-expert gate/up/down [F, D] / [F, D] / [D, F]
    expert_up: str
    expert_down: str
    fused_gate_up: str       # alternative storage: all experts fused [E, 2F, D]
    fused_down: str          # [E, D, F]
    qk_norm: str | None      # None | "head" (per head, Qwen3) | "full" (whole projection, OLMoE)
    always_renormalize: bool = False   # Mixtral renormalises top-k weights regardless of config
    has_shared_expert: bool = False
    shared_expert: str = "shared_expert"   # the shared expert's module under moe_prefix
    shared_expert_gate: bool = True        # a sigmoid gate scales the shared expert (Qwen2-MoE)
    sparse_step_keys: bool = False     # honours decoder_sparse_step / mlp_only_layers
    default_qkv_bias: bool = False     # q/k/v biases when config.json says nothing (qkv_bias / attention_bias)
    # other spellings of the same tensors (newer transformers name Mixtral's MoE block "mlp" in memory)
    aliases: tuple[tuple[str, str], ...] = ()
    # gpt-oss: biases on the router, on o_proj (q/k/v biases follow ModelSpec.qkv_bias) and on the
    # experts; a learned sink logit per head ("{a}.sinks" [H]); sliding-window layers (layer_types);
    # the clamped SwiGLU; fused experts stored [E, K, N] (x @ W) with gate and up rows interleaved.
    router_bias: bool = False
    o_bias: bool = False
    attn_sinks: bool = False
    expert_bias: bool = False
    expert_act: str = "silu"           # kernels.expert_layout.ExpertAct kind
    fused_kn: bool = False             # fused gate_up [E, D, 2F] and down [E, F, D]
    interleaved_gate_up: bool = False  # fused gate/up outputs alternate gate, up, gate, up, ...
    # without layer_types in config.json: the even layers slide over this many positions (sliding_window's
    # default) and the odd ones attend fully, as transformers' GptOssConfig fills it in; 0: every layer full
    alternate_window: int = 0
    # GLM-4.5: sigmoid router scores; experts chosen by score plus a per-expert correction bias (this
    # tensor beside the router) while the weights are the plain scores. glm_keys: config.json spells
    # the MoE as GLM does (routed_scaling_factor, n_routed_experts, n_shared_experts of
    # moe_intermediate_size, the first first_k_dense_replace layers dense, use_qk_norm switching the
    # per-head q/k norm), with transformers' Glm4MoeConfig defaults for what it leaves out
    # (partial_rotary_factor 0.5, norm_topk_prob, rms_norm_eps 1e-5, one shared expert, one dense layer)
    router_scoring: str = "softmax"
    score_bias: str | None = None
    glm_keys: bool = False
    # DeepSeek-V2 / V3 (and the models built on them: DeepSeek-V2-Lite, Moonlight, Kimi K2): multi-head
    # latent attention ("{a}.kv_a_proj_with_mqa", "{a}.kv_b_proj", "{a}.q_proj" or the "{a}.q_a_proj" /
    # "{a}.q_b_proj" pair); config.json spells the MoE as GLM does, plus moe_layer_freq, n_group /
    # topk_group (group-limited routing) and V2's topk_method, with the defaults of transformers' config
    # class of the version ("v2" or "v3") for what it leaves out
    deepseek: str = ""

    @property
    def mla(self) -> bool:
        """Attention through a compressed latent (DeepSeek's multi-head latent attention)."""
        return bool(self.deepseek)

    @property
    def router_float32(self) -> bool:
        """The router (and a choice bias) is kept and run in float32, as transformers runs it: sigmoid
        scores (a bfloat16 rounding changes which experts a token gets) and DeepSeek's routers."""
        return self.router_scoring == "sigmoid" or bool(self.deepseek)


_LLAMA_EXPERT = ("{p}.experts.{e}.gate_proj.weight", "{p}.experts.{e}.up_proj.weight",
                 "{p}.experts.{e}.down_proj.weight")

FAMILIES: dict[str, Family] = {
    "MixtralForCausalLM": Family(
        "mixtral", "model.layers.{i}.block_sparse_moe", "{p}.gate.weight",
        "{p}.experts.{e}.w1.weight", "{p}.experts.{e}.w3.weight", "{p}.experts.{e}.w2.weight",
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", None, always_renormalize=True,
        aliases=((".mlp.gate.", ".block_sparse_moe.gate."), (".mlp.experts.", ".block_sparse_moe.experts."))),
    "Qwen2MoeForCausalLM": Family(
        "qwen2_moe", "model.layers.{i}.mlp", "{p}.gate.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", None,
        has_shared_expert=True, sparse_step_keys=True, default_qkv_bias=True),
    "Qwen3MoeForCausalLM": Family(
        "qwen3_moe", "model.layers.{i}.mlp", "{p}.gate.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", "head", sparse_step_keys=True),
    "OlmoeForCausalLM": Family(
        "olmoe", "model.layers.{i}.mlp", "{p}.gate.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", "full"),
    # experts only fused (bf16 "{p}.experts.gate_up_proj", or as shipped in MXFP4: the same names with
    # _blocks / _scales); the per-expert names below never occur and are not looked for
    "GptOssForCausalLM": Family(
        "gpt_oss", "model.layers.{i}.mlp", "{p}.router.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", None, always_renormalize=True, default_qkv_bias=True,
        router_bias=True, o_bias=True, attn_sinks=True, expert_bias=True, expert_act="swiglu_oai",
        fused_kn=True, interleaved_gate_up=True, alternate_window=128),
    # GLM-4.5 and GLM-4.5-Air; qk_norm is "head" where config.json sets use_qk_norm (ModelSpec.qk_norm)
    "Glm4MoeForCausalLM": Family(
        "glm4_moe", "model.layers.{i}.mlp", "{p}.gate.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", "head", has_shared_expert=True,
        shared_expert="shared_experts", shared_expert_gate=False, router_scoring="sigmoid",
        score_bias="{p}.gate.e_score_correction_bias", glm_keys=True),
    # DeepSeek-V2 and V2-Lite: softmax scores, greedy or group-limited top-k (group max)
    "DeepseekV2ForCausalLM": Family(
        "deepseek_v2", "model.layers.{i}.mlp", "{p}.gate.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", None, has_shared_expert=True,
        shared_expert="shared_experts", shared_expert_gate=False, deepseek="v2"),
    # DeepSeek-V3 / R1, Moonlight, Kimi K2: sigmoid scores chosen with a correction bias, within the
    # best groups (each group scored by its two best biased scores)
    "DeepseekV3ForCausalLM": Family(
        "deepseek_v3", "model.layers.{i}.mlp", "{p}.gate.weight", *_LLAMA_EXPERT,
        "{p}.experts.gate_up_proj", "{p}.experts.down_proj", None, has_shared_expert=True,
        shared_expert="shared_experts", shared_expert_gate=False, router_scoring="sigmoid",
        score_bias="{p}.gate.e_score_correction_bias", deepseek="v3"),
}

SUPPORTED = ", ".join(sorted(FAMILIES))

# Names shared by every family (Llama-style attention and norms).
EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
ATTN = "model.layers.{i}.self_attn"
INPUT_NORM = "model.layers.{i}.input_layernorm.weight"
POST_NORM = "model.layers.{i}.post_attention_layernorm.weight"
DENSE_MLP = "model.layers.{i}.mlp"
