"""``ModelSpec``: the model's shape and family quirks, read from a Hugging Face ``config.json``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint.families import FAMILIES, SUPPORTED, Family
from engine.errors import ModelLoadError, UnsupportedModelError


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

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @property
    def renormalize(self) -> bool:
        return self.norm_topk_prob or self.family.always_renormalize


def _need(cfg: dict, key: str, path: Path):
    if key not in cfg:
        raise ModelLoadError(f"{path}: field '{key}' is missing from config.json; the file is incomplete or not a "
                             "Hugging Face causal-LM config")
    return cfg[key]


def _rope_theta(cfg: dict, path: Path) -> float:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        raise UnsupportedModelError(
            f"{path}: rope scaling type '{kind}' is not supported; supported: default (no scaling) — "
            "remove rope_scaling from config.json to run without long-context scaling")
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _moe_layers(cfg: dict, fam: Family, n_layers: int, n_experts: int) -> tuple[bool, ...]:
    if not fam.sparse_step_keys:
        return tuple(True for _ in range(n_layers))
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    return tuple(i not in dense and n_experts > 0 and (i + 1) % step == 0 for i in range(n_layers))


def spec_from_config(cfg: dict, path: Path) -> ModelSpec:
    """Validate a parsed config.json and turn it into a ModelSpec."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else f"model_type={cfg.get('model_type', '?')}"
    fam = FAMILIES.get(arch)
    if fam is None:
        raise UnsupportedModelError(
            f"{path}: architecture '{arch}' is not supported; Strata runs Mixture-of-Experts models of these "
            f"architectures: {SUPPORTED}")
    n_layers = int(_need(cfg, "num_hidden_layers", path))
    hidden = int(_need(cfg, "hidden_size", path))
    heads = int(_need(cfg, "num_attention_heads", path))
    n_experts = int(cfg.get("num_local_experts", cfg.get("num_experts", 0)) or 0)
    if n_experts <= 0:
        raise UnsupportedModelError(f"{path}: config.json declares no routed experts; Strata runs MoE models only")
    dense_ffn = int(_need(cfg, "intermediate_size", path))
    head_dim = cfg.get("head_dim") or hidden // heads
    return ModelSpec(
        architecture=arch, family=fam, vocab_size=int(_need(cfg, "vocab_size", path)), hidden=hidden,
        num_layers=n_layers, num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim), num_experts=n_experts, top_k=int(_need(cfg, "num_experts_per_tok", path)),
        moe_ffn=int(cfg.get("moe_intermediate_size") or dense_ffn), dense_ffn=dense_ffn,
        shared_ffn=int(cfg.get("shared_expert_intermediate_size") or 0) if fam.has_shared_expert else 0,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        qkv_bias=bool(cfg.get("qkv_bias", cfg.get("attention_bias", fam.name == "qwen2_moe"))),
        clip_qkv=cfg.get("clip_qkv"), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, path), max_position=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        moe_layers=_moe_layers(cfg, fam, n_layers, n_experts),
        checkpoint_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        name=path.name,
    )


def read_spec(model_dir: str | Path) -> ModelSpec:
    """Read ``config.json`` of a model folder; one-line errors for every way it can be wrong."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model folder '{path}' does not exist; pass --model with a folder that holds "
                             "config.json and *.safetensors")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{cfg_file} is missing; a model folder needs the Hugging Face config.json beside "
                             "its *.safetensors")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({e}); restore the file from the original checkpoint")
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file} must hold a JSON object; restore the file from the original checkpoint")
    return spec_from_config(cfg, path)
