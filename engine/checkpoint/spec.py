"""``ModelSpec``: the model's shape and family quirks, read from a Hugging Face ``config.json``.

Every field the loader reads is checked for type and range here, before anything is built from it,
so a bad value is one line naming the file, the field, what was found and what was expected.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint.config_fields import ConfigFields
from engine.checkpoint.families import FAMILIES, SUPPORTED, Family
from engine.checkpoint.converted import convert_command
from engine.checkpoint.destination import PARTIAL_MARKER
from engine.checkpoint.generation_config import check_generation_config, check_token_ids
from engine.checkpoint.reader import cannot_read, check_folder_readable
from engine.errors import ModelLoadError, UnsupportedModelError

MAX_LAYERS = 4096       # sanity bounds: far above any released model, far below what hangs a loop
MAX_EXPERTS = 65536
MAX_POSITION = (1 << 31) - 1   # positions index 32-bit tables in the kernels

# the checkpoint's own dtype, as Hugging Face writes it (other spellings map to these)
CHECKPOINT_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "float64": "float64",
                     "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
ACTIVATIONS = ("silu", "swish")      # what every supported family's expert and dense MLPs use


@dataclass(frozen=True)
class RopeScaling:
    """Long-context RoPE scaling (``rope_scaling`` / ``rope_parameters``); only ``yarn`` so far."""

    kind: str                        # "yarn"
    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None   # None: 0.1 * ln(factor) + 1 (1 when factor <= 1)
    mscale_all_dim: float = 0.0             # DeepSeek's latent attention: softmax scale times its mscale squared

    @property
    def mscale(self) -> float:
        """The factor YaRN multiplies the cos and sin tables by."""
        if self.attention_factor is not None:
            return self.attention_factor
        return _yarn_mscale(self.factor, 1.0)


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2 / V3): each token's keys and values are one compressed
    latent of ``kv_lora_rank`` values (normed) plus one shared rotary key of ``qk_rope`` values; a head's
    key is its ``qk_nope`` up-projected values of the latent and the shared rotary key, its value
    ``v_head_dim`` more. The cache keeps the latent and the rotary key alone (:attr:`latent_dim` values
    a token and layer: the latent in the K plane, the rotary key in the V plane), and attention runs on
    them with the up-projections folded into the queries and the outputs (engine/models/mla.py)."""

    q_lora_rank: int              # 0: queries straight from the hidden state (q_proj)
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head_dim: int
    interleaved: bool             # the checkpoint's rotary pairs are (2j, 2j + 1), not (j, j + qk_rope / 2)
    softmax_scale: float          # 1 / sqrt(qk_nope + qk_rope), times YaRN's mscale_all_dim factor squared

    @property
    def latent_dim(self) -> int:
        """Values one token keeps in one layer's cache: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    family: Family
    vocab_size: int
    hidden: int                     # D
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int                # E
    top_k: int                      # k
    moe_ffn: int                    # F, routed expert FFN width
    dense_ffn: int                  # FFN width of dense (non-MoE) layers
    shared_ffn: int                 # shared expert width (0 = none)
    norm_topk_prob: bool
    qkv_bias: bool
    clip_qkv: float | None
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    moe_layers: tuple[bool, ...]    # per layer: routed experts (True) or a dense MLP
    checkpoint_dtype: str = "bfloat16"
    name: str = ""
    layer_windows: tuple[int, ...] = ()      # per layer: sliding window in tokens, 0 = full attention; () = all full
    rope_scaling: RopeScaling | None = None
    swiglu_alpha: float = 1.702              # gpt-oss clamped SwiGLU (family.expert_act == "swiglu_oai")
    swiglu_limit: float = 7.0
    expert_storage: str = "dense"            # "mxfp4": the checkpoint ships its experts as *_blocks / *_scales;
    #                                          "fp8": its matrices as e4m3 with block scales (weight_block)
    weight_block: tuple[int, int] = ()       # fp8 checkpoints: rows x cols of a matrix that share a scale
    rotary_dim: int = 0                      # dimensions of a head that RoPE turns (GLM: half); 0: all of them
    routed_scale: float = 1.0                # routed experts' weights times this (routed_scaling_factor)
    use_qk_norm: bool = True                 # the family's q/k norm is there (GLM: use_qk_norm)
    mla: MLA | None = None                   # DeepSeek's latent attention (head_dim: qk_nope + qk_rope then)
    route_groups: int = 1                    # experts in this many equal groups (n_group) ...
    route_keep_groups: int = 1               # ... of which a token's experts come from the best (topk_group)
    # the embedding, final norm and LM head belong to this model (False: a pipeline stage past the first,
    # engine/parallel/stages.py, which holds layers only)
    head: bool = True

    def window(self, layer: int) -> int:
        """Sliding window of ``layer`` in tokens (0: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def kv_heads_stored(self) -> int:
        """Heads of one layer's K (and V) cache rows: the KV heads, or 1 with latent attention."""
        return 1 if self.mla else self.num_kv_heads

    @property
    def kv_head_dim_stored(self) -> int:
        """Values of one head of a K cache row: the head dim, or with latent attention the latent."""
        return self.mla.kv_lora_rank if self.mla else self.head_dim

    @property
    def kv_v_dim_stored(self) -> int:
        """Values of one head of a V cache row: the head dim, or with latent attention the rotary key (the
        latent, the values' source, is in the K plane)."""
        return self.mla.qk_rope if self.mla else self.head_dim

    @property
    def rope_dim(self) -> int:
        """Dimensions of each q/k head that RoPE rotates (the rest pass through)."""
        return self.rotary_dim or self.head_dim

    @property
    def qk_norm(self) -> str | None:
        """None, "head" or "full": the family's q/k norm where this model has one."""
        return self.family.qk_norm if self.use_qk_norm else None

    @property
    def o_bias(self) -> bool:
        """o_proj has a bias (gpt-oss: attention_bias covers all four projections)."""
        return self.family.o_bias and self.qkv_bias

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @property
    def renormalize(self) -> bool:
        return self.norm_topk_prob or self.family.always_renormalize


def _at_most(f: ConfigFields, key: str, n: int, limit: int) -> int:
    """A count past any real model is a damaged config, refused before a loop over it runs for hours."""
    if n > limit:
        raise f.bad(key, n, f"at most {limit} (no released model has more)")
    return n


def _family(f: ConfigFields) -> tuple[str, Family]:
    archs = f.str_list("architectures", "Qwen3MoeForCausalLM")
    if not archs:
        named = next((a for a, fam in FAMILIES.items() if fam.name == f.cfg.get("model_type")), None)
        if named is not None:     # a supported model whose config lost its architectures list
            raise ModelLoadError(f"{f.file}: field 'architectures' is missing or empty; for model_type "
                                 f"'{f.cfg.get('model_type')}' add \"architectures\": [\"{named}\"]")
    if not archs and not f.given("model_type"):
        parent = f.file.parent.parent
        if _names_architectures(parent / "config.json"):    # gpt-oss's original/: its own format, not Hugging Face's
            raise ModelLoadError(f"{f.file.parent} holds weights in a format of their own, not a Hugging Face "
                                 f"checkpoint (its config.json names no architecture); open {parent} instead")
        raise ModelLoadError(f"{f.file} names no architecture (neither 'architectures' nor 'model_type'); restore "
                             "config.json from the original checkpoint")
    arch = archs[0] if archs else f"model_type={f.cfg.get('model_type')}"
    fam = FAMILIES.get(arch)
    if fam is None:
        raise UnsupportedModelError(
            f"{f.file.parent}: architecture '{arch}' is not supported; open a Mixture-of-Experts checkpoint of one "
            f"of these architectures: {SUPPORTED}")
    act = f.text("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"{f.file}: hidden_act '{act}' is not supported; Strata runs {arch} with silu "
                                    "experts, so this checkpoint is not a standard one of that architecture")
    return arch, fam


def _names_architectures(config: Path) -> bool:
    """Whether ``config`` is a readable config.json with an ``architectures`` list (a Hugging Face one)."""
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("architectures"))
    except (OSError, ValueError, AttributeError):
        return False


ROPE_TYPES = ("default", "yarn")
LAYER_TYPES = ("sliding_attention", "full_attention")


ROPE_KEYS = ("rope_parameters", "rope_scaling")      # newer, older: transformers takes rope_scaling when both are set


def _rope_objects(f: ConfigFields) -> list[ConfigFields]:
    """The RoPE objects config.json sets, rope_parameters first; each one checked as an object."""
    example = '{"rope_type": "default", "rope_theta": 10000.0}'
    return [rope for key in ROPE_KEYS if (rope := f.nested(key, example)) is not None]


def _rope(f: ConfigFields, max_position: int) -> tuple[float, RopeScaling | None]:
    """``rope_theta`` and the RoPE scaling, from ``rope_parameters`` (newer) or ``rope_scaling`` (older).

    Both are checked when both are set, and must then say the same: transformers reads rope_scaling and drops
    rope_parameters, Strata read the other way, so which one the checkpoint means is the user's to say."""
    read = [(rope, _scaling(f, rope, max_position)) for rope in _rope_objects(f)]
    if len(read) == 2:
        (new, new_scaling), (old, old_scaling) = read
        alike = {"type": "rope_type"}
        shared = {alike.get(k, k) for k in new.cfg} & {alike.get(k, k) for k in old.cfg}
        if new_scaling != old_scaling or any(new.cfg.get(k) != old.cfg.get(k) for k in shared - {"rope_type"}):
            raise ModelLoadError(
                f"{f.file}: fields 'rope_parameters' ({new.show()}) and 'rope_scaling' ({old.show()}) both set the "
                "RoPE and disagree; delete the one that is wrong (transformers would use rope_scaling)")
    theta = next((t for rope, _ in read if (t := rope.number("rope_theta", None)) is not None), None)
    if theta is None:      # a null top-level rope_theta is refused: transformers builds a model that cannot run
        theta = f.number("rope_theta", 10000.0)
    return theta, read[0][1] if read else None


def _scaling(f: ConfigFields, rope: ConfigFields, max_position: int) -> RopeScaling | None:
    """The long-context scaling one RoPE object asks for (None: none)."""
    kind = rope.text(rope.first_given("rope_type", "type"), "default")
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"{f.file.parent}: rope scaling type '{kind}' is not supported; supported: default (no scaling), yarn — "
            f"remove {rope.prefix[:-1]} from config.json to run without long-context scaling")
    return _yarn(f, rope, max_position) if kind == "yarn" else None


def _yarn(f: ConfigFields, rope: ConfigFields, max_position: int) -> RopeScaling:
    """YaRN's fields with Hugging Face's defaults (a top-level original_max_position_embeddings wins)."""
    top = f.given("original_max_position_embeddings")
    original = (f if top else rope).integer("original_max_position_embeddings", max_position)
    factor = rope.number("factor", max_position / original)
    attention = rope.number("attention_factor", None)
    if attention is None and rope.given("mscale") and rope.given("mscale_all_dim"):
        attention = (_yarn_mscale(factor, rope.number("mscale", None))
                     / _yarn_mscale(factor, rope.number("mscale_all_dim", None)))
    return RopeScaling("yarn", factor, original, rope.number("beta_fast", 32.0), rope.number("beta_slow", 1.0),
                       rope.flag("truncate", True), attention, rope.number("mscale_all_dim", None) or 0.0)


def _layer_windows(f: ConfigFields, n_layers: int, fam: Family) -> tuple[int, ...]:
    """Per layer, its sliding window (0: full attention), from ``layer_types``; () when every layer is full.
    Without ``layer_types`` a family that alternates (gpt-oss) slides on its even layers, as transformers
    fills the list in."""
    if not f.given("layer_types"):
        if not fam.alternate_window:
            return ()
        window = f.integer("sliding_window", fam.alternate_window, why="the even layers slide over it")
        return tuple(window if i % 2 == 0 else 0 for i in range(n_layers))
    kinds = f.str_list("layer_types", LAYER_TYPES[0])
    if len(kinds) != n_layers or any(k not in LAYER_TYPES for k in kinds):
        raise f.bad("layer_types", f.cfg["layer_types"], f"a list of {n_layers} entries (num_hidden_layers), each "
                                                          '"sliding_attention" or "full_attention"')
    if LAYER_TYPES[0] not in kinds:
        return ()
    window = f.integer("sliding_window", why="layer_types has sliding_attention layers")
    return tuple(window if k == LAYER_TYPES[0] else 0 for k in kinds)


def _quantisation(f: ConfigFields) -> tuple[str, tuple[int, int]]:
    """How the checkpoint ships its weights: ("dense", ()), ("mxfp4", ()) for gpt-oss's MXFP4 experts, or
    ("fp8", (rows, cols)) for e4m3 matrices with one float32 ``weight_scale_inv`` per block of rows x cols
    (DeepSeek-V3 / R1, Kimi K2, the -FP8 releases of Qwen3 and GLM-4.5)."""
    quant = f.nested("quantization_config", '{"quant_method": "mxfp4"}')
    if quant is None:
        return "dense", ()
    method = quant.text("quant_method", "none")
    if method == "mxfp4":
        return "mxfp4", ()
    if method == "fp8":
        fmt = quant.text("fmt", "e4m3")
        if fmt != "e4m3":
            raise quant.bad("fmt", fmt, '"e4m3" (the fp8 format Strata reads)')
        if not quant.given("weight_block_size"):
            raise UnsupportedModelError(
                f"{f.file}: an fp8 checkpoint without quantization_config.weight_block_size (one scale per tensor) is "
                "not supported; Strata reads fp8 weights with one scale per block (weight_scale_inv), as DeepSeek "
                "and the Qwen3 / GLM -FP8 releases ship them — or use the model's bfloat16 release")
        block = quant.int_list("weight_block_size", 1, 1 << 16)
        if len(block) != 2:
            raise quant.bad("weight_block_size", quant.cfg["weight_block_size"], "two block sizes, e.g. [128, 128]")
        return "fp8", (block[0], block[1])
    raise UnsupportedModelError(
        f"{f.file}: quantization_config.quant_method '{method}' is not supported; Strata reads unquantised "
        "(bfloat16, float16, float32) checkpoints, fp8 ones with block scales and MXFP4 experts — use the model's "
        f"unquantised release ({convert_command()} then makes Strata's own int4 or fp8)")


def _head_dim(f: ConfigFields, hidden: int, heads: int) -> int:
    if f.given("head_dim"):
        head_dim = f.integer("head_dim")
        if head_dim % 2:
            raise f.bad("head_dim", head_dim, "an even number (rotary embeddings turn pairs of dimensions)")
        return head_dim
    if hidden % heads or (hidden // heads) % 2:
        raise f.bad("hidden_size", hidden, f"a multiple of 2 x num_attention_heads ({2 * heads}) when head_dim is "
                                           "not given (the head size, hidden_size / num_attention_heads, is even)")
    return hidden // heads


def _kv_heads(f: ConfigFields, heads: int) -> int:
    kv = f.integer("num_key_value_heads", heads)
    if heads % kv:
        raise f.bad("num_key_value_heads", kv, f"a divisor of num_attention_heads ({heads})")
    return kv


def _num_experts(f: ConfigFields) -> int:
    given = {k: _at_most(f, k, f.integer(k, minimum=0), MAX_EXPERTS)
             for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in f.cfg}
    if len(set(given.values())) > 1:
        first, *rest = given
        raise f.bad(rest[0], given[rest[0]], f"equal to {first} ({given[first]}), since both count the experts")
    n = next(iter(given.values()), 0)
    if n == 0:
        raise UnsupportedModelError(f"{f.file}: config.json declares no routed experts (num_experts or "
                                    "num_local_experts); Strata runs MoE models only")
    return n


# transformers' defaults by DeepSeek version, for fields a config.json leaves out
# the routed experts' weights times this: released models use 1 to 16, and a huge one overflows 16-bit outputs
ROUTED_SCALE_BOUND = {"maximum": 100.0, "why": "released models use 1 to 16"}
DEEPSEEK_DEFAULTS = {"v2": {"first_k_dense_replace": 0, "n_shared_experts": 2, "routed_scaling_factor": 1.0,
                            "norm_topk_prob": False, "topk_method": "greedy", "n_group": 1},
                     "v3": {"first_k_dense_replace": 3, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
                            "norm_topk_prob": True, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4}}
TOPK_METHODS = {"v2": ("greedy", "group_limited_greedy"), "v3": ("noaux_tc",)}


def _moe_layers(f: ConfigFields, fam: Family, n_layers: int) -> tuple[bool, ...]:
    if fam.deepseek:
        first = min(DEEPSEEK_DEFAULTS[fam.deepseek]["first_k_dense_replace"], n_layers - 1)
        dense = f.integer("first_k_dense_replace", first, minimum=0, maximum=n_layers - 1,
                          why=f"the model has {n_layers} layers and needs one with experts")
        step = f.integer("moe_layer_freq", 1, maximum=n_layers)
        layers = tuple(i >= dense and i % step == 0 for i in range(n_layers))
        if not any(layers):
            raise f.bad("moe_layer_freq", step, f"a step that leaves a layer with experts after the first {dense}")
        return layers
    if fam.glm_keys:
        dense = f.integer("first_k_dense_replace", min(1, n_layers - 1), minimum=0, maximum=n_layers - 1,
                          why=f"the model has {n_layers} layers and needs one with experts")
        return tuple(i >= dense for i in range(n_layers))
    if not fam.sparse_step_keys:
        return tuple(True for _ in range(n_layers))
    step = f.integer("decoder_sparse_step", 1)
    dense = set(f.int_list("mlp_only_layers", 0, n_layers - 1))
    layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers))
    if not any(layers):
        raise UnsupportedModelError(
            f"{f.file}: every one of the {n_layers} layers is a dense MLP (decoder_sparse_step {step}, mlp_only_layers "
            f"{sorted(dense)}), so there are no experts to run; Strata runs MoE models only")
    return layers


def _rotary_dim(f: ConfigFields, head_dim: int, default: float) -> int:
    """The head dimensions RoPE turns: ``partial_rotary_factor`` (top level, or in ``rope_parameters`` /
    ``rope_scaling``; ``default`` when none gives it) of ``head_dim``; 0 for all of them."""
    owner = next((rope for rope in _rope_objects(f) if "partial_rotary_factor" in rope.cfg), f)
    factor = owner.number("partial_rotary_factor", default)
    dim = int(head_dim * factor)
    if factor > 1 or dim < 2 or dim % 2:
        raise owner.bad("partial_rotary_factor", factor,
                        f"a fraction up to 1 of head_dim {head_dim} that leaves an even number of dimensions to rotate")
    return 0 if dim == head_dim else dim


def _glm_routing(f: ConfigFields, n_experts: int) -> float:
    """GLM's ``routed_scaling_factor``, after checking that ``n_group`` / ``topk_group`` limit nothing (every
    GLM-4.5 release has one group; group-limited routing, as in DeepSeek-V3, is not supported)."""
    groups = f.integer("n_group", 1, maximum=n_experts)
    keep = f.integer("topk_group", groups, maximum=groups, why=f"at most n_group ({groups})")
    if keep < groups:
        raise UnsupportedModelError(
            f"{f.file}: group-limited expert routing (n_group {groups}, topk_group {keep}) is not supported; Strata "
            "runs GLM-4.5 models whose experts form one group (n_group 1)")
    return f.number("routed_scaling_factor", 1.0, **ROUTED_SCALE_BOUND)


def _shared_ffn(f: ConfigFields, fam: Family, moe_ffn: int) -> int:
    """Width of the shared expert (0: none): Qwen2-MoE's own field, or GLM's and DeepSeek's n_shared_experts
    expert widths."""
    if not fam.has_shared_expert:
        return 0
    if fam.glm_keys or fam.deepseek:
        default = DEEPSEEK_DEFAULTS[fam.deepseek]["n_shared_experts"] if fam.deepseek else 1
        return f.integer("n_shared_experts", default, minimum=0, maximum=64) * moe_ffn
    return f.integer("shared_expert_intermediate_size", 0, minimum=0)


def _deepseek_routing(f: ConfigFields, fam: Family, n_experts: int, top_k: int) -> tuple[float, int, int]:
    """DeepSeek's ``routed_scaling_factor`` and its expert groups: (scale, n_group, topk_group), with one
    group where routing picks from all experts (V2's greedy top-k)."""
    defaults = DEEPSEEK_DEFAULTS[fam.deepseek]
    scale = f.number("routed_scaling_factor", defaults["routed_scaling_factor"], **ROUTED_SCALE_BOUND)
    method = f.text("topk_method", defaults["topk_method"])
    if method not in TOPK_METHODS[fam.deepseek]:
        raise f.bad("topk_method", method, " or ".join(f'"{m}"' for m in TOPK_METHODS[fam.deepseek])
                    + f" for {fam.name}")
    want = "sigmoid" if fam.router_scoring == "sigmoid" else "softmax"
    if f.text("scoring_func", want) != want:
        raise f.bad("scoring_func", f.cfg["scoring_func"], f'"{want}" (the scores {fam.name} routes by)')
    if method == "greedy":
        return scale, 1, 1
    groups = f.integer("n_group", min(defaults["n_group"], n_experts), maximum=n_experts)
    if n_experts % groups:
        raise f.bad("n_group", groups, f"a divisor of the {n_experts} routed experts")
    keep = f.integer("topk_group", min(defaults.get("topk_group", groups), groups), maximum=groups,
                     why=f"at most n_group ({groups})")
    if fam.router_scoring == "sigmoid" and keep < groups and n_experts // groups < 2:
        raise f.bad("n_group", groups, f"at most {n_experts // 2}: each group is scored by its two best experts")
    if keep * (n_experts // groups) < top_k:
        raise f.bad("topk_group", keep, f"enough groups of {n_experts // groups} experts for the {top_k} a token takes")
    return scale, groups, keep


def _mla(f: ConfigFields, fam: Family, rope_scaling: RopeScaling | None) -> MLA | None:
    """DeepSeek's latent attention's shape (None for other families)."""
    if not fam.mla:
        return None
    if f.flag("attention_bias", False):
        raise UnsupportedModelError(f"{f.file}: attention_bias true is not supported for {fam.name} (no released "
                                    "DeepSeek model has attention biases); set it to false if the weights have none")
    # null means no query compression; a config without the field takes transformers' 1536
    q_rank = 0 if "q_lora_rank" in f.cfg and f.cfg["q_lora_rank"] is None else f.integer("q_lora_rank", 1536)
    kv_rank, nope = f.integer("kv_lora_rank", 512), f.integer("qk_nope_head_dim", 128)
    rope, v = f.integer("qk_rope_head_dim", 64), f.integer("v_head_dim", 128)
    if rope % 2:
        raise f.bad("qk_rope_head_dim", rope, "an even number (rotary embeddings turn pairs of dimensions)")
    scale = (nope + rope) ** -0.5
    if rope_scaling is not None and rope_scaling.mscale_all_dim:
        scale *= _yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim) ** 2
    interleaved = fam.deepseek == "v2" or f.flag("rope_interleave", True)
    return MLA(q_rank, kv_rank, nope, rope, v, interleaved, scale)


def spec_from_config(cfg: dict, path: Path) -> ModelSpec:
    """Validate a parsed config.json of the model folder ``path`` and turn it into a ModelSpec."""
    f = ConfigFields(cfg, path / "config.json")
    arch, fam = _family(f)
    n_layers = _at_most(f, "num_hidden_layers", f.integer("num_hidden_layers"), MAX_LAYERS)
    hidden, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
    n_experts = _num_experts(f)
    dense_ffn = f.integer("intermediate_size")
    bias_key = f.first_given("qkv_bias", "attention_bias")
    max_position = f.integer("max_position_embeddings", 4096, maximum=MAX_POSITION,
                             why="positions are 32-bit integers")
    rope_theta, rope_scaling = _rope(f, max_position)
    quantisation = _quantisation(f)
    mla = _mla(f, fam, rope_scaling)
    # latent attention: a head's q.k dimensions, every head its own KV head (the cache keeps the latent)
    head_dim = mla.qk_nope + mla.qk_rope if mla else _head_dim(f, hidden, heads)
    moe_ffn = f.integer("moe_intermediate_size", dense_ffn)
    top_k = f.integer("num_experts_per_tok", maximum=n_experts, why=f"the model has {n_experts} routed experts")
    if fam.deepseek:
        routed_scale, groups, keep = _deepseek_routing(f, fam, n_experts, top_k)
    else:
        routed_scale, groups, keep = (_glm_routing(f, n_experts) if fam.glm_keys else 1.0), 1, 1
    renorm_default = DEEPSEEK_DEFAULTS[fam.deepseek]["norm_topk_prob"] if fam.deepseek else fam.glm_keys
    renorm = f.flag("norm_topk_prob", renorm_default)
    if fam.deepseek == "v2":          # DeepSeek-V2 renormalises more than one weight, or else scales them: never both
        renorm = renorm and top_k > 1
        routed_scale = 1.0 if renorm else routed_scale
    vocab_size = f.integer("vocab_size")
    check_token_ids(f, vocab_size)
    return ModelSpec(
        architecture=arch, family=fam, vocab_size=vocab_size, hidden=hidden,
        num_layers=n_layers, num_heads=heads, num_kv_heads=heads if mla else _kv_heads(f, heads), head_dim=head_dim,
        num_experts=n_experts, top_k=top_k,
        moe_ffn=moe_ffn, dense_ffn=dense_ffn, shared_ffn=_shared_ffn(f, fam, moe_ffn),
        norm_topk_prob=renorm,
        qkv_bias=f.flag(bias_key, fam.default_qkv_bias),
        clip_qkv=f.number("clip_qkv", None), rms_norm_eps=f.number("rms_norm_eps", 1e-5 if fam.glm_keys else 1e-6),
        rope_theta=rope_theta, max_position=max_position,
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        moe_layers=_moe_layers(f, fam, n_layers),
        checkpoint_dtype=f.choice(f.first_given("torch_dtype", "dtype"), CHECKPOINT_DTYPES, "bfloat16"),
        name=path.name, layer_windows=_layer_windows(f, n_layers, fam), rope_scaling=rope_scaling,
        swiglu_alpha=f.number("swiglu_alpha", 1.702), swiglu_limit=f.number("swiglu_limit", 7.0),
        expert_storage=quantisation[0], weight_block=quantisation[1],
        rotary_dim=mla.qk_rope if mla else _rotary_dim(f, head_dim, 0.5 if fam.glm_keys else 1.0),
        routed_scale=routed_scale, use_qk_norm=f.flag("use_qk_norm", False) if fam.glm_keys else True,
        mla=mla, route_groups=groups, route_keep_groups=keep,
    )


def read_spec(model_dir: str | Path) -> ModelSpec:
    """Read ``config.json`` of a model folder; one-line errors for every way it can be wrong."""
    if not str(model_dir).strip():
        raise ModelLoadError("no model folder was given; pass --model with the folder that holds config.json and "
                             "*.safetensors")
    path = Path(model_dir)
    check_folder_readable(path)
    if path.exists() and not path.is_dir():
        raise ModelLoadError(f"'{path}' is a file, not a model folder; pass --model with the folder that holds "
                             "config.json and *.safetensors")
    if not path.is_dir():
        raise ModelLoadError(f"model folder '{path}' does not exist; pass --model with a folder that holds "
                             "config.json and *.safetensors")
    cfg_file = path / "config.json"
    if cfg_file.is_dir():
        raise ModelLoadError(f"{cfg_file} is a folder, not a file; put the checkpoint's config.json there instead")
    if cfg_file.is_symlink() and not cfg_file.exists():
        raise ModelLoadError(f"{cfg_file} is a link to {os.readlink(cfg_file)}, which does not exist; fetch the "
                             "checkpoint again (a download cache lost the file the link points to)")
    if not cfg_file.is_file() and (path / PARTIAL_MARKER).is_file():
        raise ModelLoadError(f"{path} is a conversion that did not finish (convert was stopped before its end); "
                             "run the same convert command again, which replaces it, or delete the folder")
    if not cfg_file.is_file():
        raise ModelLoadError(f"{cfg_file} is missing; a model folder needs the Hugging Face config.json beside "
                             "its *.safetensors")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({e}); restore the file from the original checkpoint")
    except OSError as e:
        raise cannot_read(cfg_file, e, "restore the file from the original checkpoint") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file} must hold a JSON object; restore the file from the original checkpoint")
    spec = spec_from_config(cfg, path)
    check_generation_config(path, spec.vocab_size)
    return spec
