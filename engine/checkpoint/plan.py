"""Every tensor a model of a given spec must have: name, shape and category.

Used to validate a checkpoint before loading, to count bytes by category for ``main.py info``,
and to build a random model in memory for benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.checkpoint import families as fn
from engine.checkpoint.spec import ModelSpec

CATEGORIES = ("embeddings", "attention", "norms", "router", "dense_mlp", "shared_experts", "routed_experts")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    category: str
    layer: int = -1
    expert: int = -1
    part: str = ""            # for routed experts: gate | up | down


def _attention(spec: ModelSpec, i: int) -> list[TensorEntry]:
    p = fn.ATTN.format(i=i)
    D, hd, H, Hkv = spec.hidden, spec.head_dim, spec.num_heads, spec.num_kv_heads
    out = [TensorEntry(f"{p}.q_proj.weight", (H * hd, D), "attention", i),
           TensorEntry(f"{p}.k_proj.weight", (Hkv * hd, D), "attention", i),
           TensorEntry(f"{p}.v_proj.weight", (Hkv * hd, D), "attention", i),
           TensorEntry(f"{p}.o_proj.weight", (D, H * hd), "attention", i)]
    if spec.qkv_bias:
        out += [TensorEntry(f"{p}.{n}_proj.bias", (h * hd,), "attention", i)
                for n, h in (("q", H), ("k", Hkv), ("v", Hkv))]
    if spec.family.qk_norm == "head":
        out += [TensorEntry(f"{p}.q_norm.weight", (hd,), "norms", i), TensorEntry(f"{p}.k_norm.weight", (hd,), "norms", i)]
    elif spec.family.qk_norm == "full":
        out += [TensorEntry(f"{p}.q_norm.weight", (H * hd,), "norms", i),
                TensorEntry(f"{p}.k_norm.weight", (Hkv * hd,), "norms", i)]
    return out


def _mlp(prefix: str, D: int, F: int, category: str, i: int) -> list[TensorEntry]:
    return [TensorEntry(f"{prefix}.gate_proj.weight", (F, D), category, i),
            TensorEntry(f"{prefix}.up_proj.weight", (F, D), category, i),
            TensorEntry(f"{prefix}.down_proj.weight", (D, F), category, i)]


def routed_expert_entries(spec: ModelSpec, i: int) -> list[TensorEntry]:
    fam, D, F = spec.family, spec.hidden, spec.moe_ffn
    p = fam.moe_prefix.format(i=i)
    out = []
    for e in range(spec.num_experts):
        for part, tmpl, shape in (("gate", fam.expert_gate, (F, D)), ("up", fam.expert_up, (F, D)),
                                  ("down", fam.expert_down, (D, F))):
            out.append(TensorEntry(tmpl.format(p=p, e=e), shape, "routed_experts", i, e, part))
    return out


def tensor_plan(spec: ModelSpec) -> list[TensorEntry]:
    """All tensors of the model in the checkpoint's (unfused) naming."""
    D, V = spec.hidden, spec.vocab_size
    out = [TensorEntry(fn.EMBED, (V, D), "embeddings"), TensorEntry(fn.FINAL_NORM, (D,), "norms")]
    if not spec.tie_word_embeddings:
        out.append(TensorEntry(fn.LM_HEAD, (V, D), "embeddings"))
    for i in range(spec.num_layers):
        out += [TensorEntry(fn.INPUT_NORM.format(i=i), (D,), "norms", i),
                TensorEntry(fn.POST_NORM.format(i=i), (D,), "norms", i)]
        out += _attention(spec, i)
        if not spec.moe_layers[i]:
            out += _mlp(fn.DENSE_MLP.format(i=i), D, spec.dense_ffn, "dense_mlp", i)
            continue
        p = spec.family.moe_prefix.format(i=i)
        out.append(TensorEntry(spec.family.router.format(p=p), (spec.num_experts, D), "router", i))
        if spec.shared_ffn:
            out += _mlp(f"{p}.shared_expert", D, spec.shared_ffn, "shared_experts", i)
            out.append(TensorEntry(f"{p}.shared_expert_gate.weight", (1, D), "shared_experts", i))
        out += routed_expert_entries(spec, i)
    return out


def params_by_category(spec: ModelSpec) -> dict[str, int]:
    """Parameter counts per category (tied embeddings counted once)."""
    counts = dict.fromkeys(CATEGORIES, 0)
    for t in tensor_plan(spec):
        n = 1
        for s in t.shape:
            n *= s
        counts[t.category] += n
    return counts


def active_params_per_token(spec: ModelSpec) -> int:
    """Parameters read to generate one token: everything but the routed experts, plus k of them per MoE layer."""
    c = params_by_category(spec)
    per_expert = 3 * spec.hidden * spec.moe_ffn
    lm_head_rows = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden
    # of the embedding table only one row is read; the LM head is read whole
    embed_read = spec.hidden + (spec.vocab_size * spec.hidden if spec.tie_word_embeddings else lm_head_rows)
    return (c["attention"] + c["norms"] + c["router"] + c["dense_mlp"] + c["shared_experts"]
            + spec.num_moe_layers * spec.top_k * per_expert + embed_read)
