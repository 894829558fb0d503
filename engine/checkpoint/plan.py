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
    part: str = ""            # routed experts: gate | up | down (per expert); gate_up | down | gate_up_bias | down_bias


def _latent_attention(spec: ModelSpec, i: int) -> list[TensorEntry]:
    """DeepSeek's latent attention: queries straight (q_proj) or through a normed low-rank pair (q_a_proj,
    q_a_layernorm, q_b_proj); the latent and the shared rotary key (kv_a_proj_with_mqa), the latent's
    norm, the per-head key and value up-projection (kv_b_proj) and the output (o_proj)."""
    p, m, D, H = fn.ATTN.format(i=i), spec.mla, spec.hidden, spec.num_heads
    qk = m.qk_nope + m.qk_rope
    if m.q_lora_rank:
        out = [TensorEntry(f"{p}.q_a_proj.weight", (m.q_lora_rank, D), "attention", i),
               TensorEntry(f"{p}.q_a_layernorm.weight", (m.q_lora_rank,), "norms", i),
               TensorEntry(f"{p}.q_b_proj.weight", (H * qk, m.q_lora_rank), "attention", i)]
    else:
        out = [TensorEntry(f"{p}.q_proj.weight", (H * qk, D), "attention", i)]
    return out + [TensorEntry(f"{p}.kv_a_proj_with_mqa.weight", (m.latent_dim, D), "attention", i),
                  TensorEntry(f"{p}.kv_a_layernorm.weight", (m.kv_lora_rank,), "norms", i),
                  TensorEntry(f"{p}.kv_b_proj.weight", (H * (m.qk_nope + m.v_head_dim), m.kv_lora_rank), "attention", i),
                  TensorEntry(f"{p}.o_proj.weight", (D, H * m.v_head_dim), "attention", i)]


def _attention(spec: ModelSpec, i: int) -> list[TensorEntry]:
    if spec.mla:
        return _latent_attention(spec, i)
    p = fn.ATTN.format(i=i)
    D, hd, H, Hkv = spec.hidden, spec.head_dim, spec.num_heads, spec.num_kv_heads
    out = [TensorEntry(f"{p}.q_proj.weight", (H * hd, D), "attention", i),
           TensorEntry(f"{p}.k_proj.weight", (Hkv * hd, D), "attention", i),
           TensorEntry(f"{p}.v_proj.weight", (Hkv * hd, D), "attention", i),
           TensorEntry(f"{p}.o_proj.weight", (D, H * hd), "attention", i)]
    if spec.qkv_bias:
        out += [TensorEntry(f"{p}.{n}_proj.bias", (h * hd,), "attention", i)
                for n, h in (("q", H), ("k", Hkv), ("v", Hkv))]
    if spec.o_bias:
        out.append(TensorEntry(f"{p}.o_proj.bias", (D,), "attention", i))
    if spec.family.attn_sinks:
        out.append(TensorEntry(f"{p}.sinks", (H,), "attention", i))
    if spec.qk_norm == "head":
        out += [TensorEntry(f"{p}.q_norm.weight", (hd,), "norms", i), TensorEntry(f"{p}.k_norm.weight", (hd,), "norms", i)]
    elif spec.qk_norm == "full":
        out += [TensorEntry(f"{p}.q_norm.weight", (H * hd,), "norms", i),
                TensorEntry(f"{p}.k_norm.weight", (Hkv * hd,), "norms", i)]
    return out


def _mlp(prefix: str, D: int, F: int, category: str, i: int) -> list[TensorEntry]:
    return [TensorEntry(f"{prefix}.gate_proj.weight", (F, D), category, i),
            TensorEntry(f"{prefix}.up_proj.weight", (F, D), category, i),
            TensorEntry(f"{prefix}.down_proj.weight", (D, F), category, i)]


def routed_expert_entries(spec: ModelSpec, i: int) -> list[TensorEntry]:
    """Layer ``i``'s routed experts as the checkpoint stores them: per expert, or fused (gpt-oss) with
    gate_up ``[E, D, 2F]``, down ``[E, F, D]`` and with expert biases ``[E, 2F]`` / ``[E, D]``."""
    fam, D, F, E = spec.family, spec.hidden, spec.moe_ffn, spec.num_experts
    p = fam.moe_prefix.format(i=i)
    if fam.fused_kn:
        gu, dn = fam.fused_gate_up.format(p=p), fam.fused_down.format(p=p)
        out = [TensorEntry(gu, (E, D, 2 * F), "routed_experts", i, part="gate_up"),
               TensorEntry(dn, (E, F, D), "routed_experts", i, part="down")]
        if fam.expert_bias:
            out += [TensorEntry(gu + "_bias", (E, 2 * F), "routed_experts", i, part="gate_up_bias"),
                    TensorEntry(dn + "_bias", (E, D), "routed_experts", i, part="down_bias")]
        return out
    out = []
    for e in range(E):
        for part, tmpl, shape in (("gate", fam.expert_gate, (F, D)), ("up", fam.expert_up, (F, D)),
                                  ("down", fam.expert_down, (D, F))):
            out.append(TensorEntry(tmpl.format(p=p, e=e), shape, "routed_experts", i, e, part))
    return out


def score_bias_name(spec: ModelSpec, i: int) -> str | None:
    """Layer ``i``'s expert-score correction bias (GLM), or None where the family has none."""
    tmpl = spec.family.score_bias
    return None if tmpl is None else tmpl.format(p=spec.family.moe_prefix.format(i=i))


def shared_expert_names(spec: ModelSpec, i: int) -> tuple[str, str | None]:
    """Layer ``i``'s shared expert module and its gate's weight (None: ungated)."""
    p = spec.family.moe_prefix.format(i=i)
    gate = f"{p}.shared_expert_gate.weight" if spec.family.shared_expert_gate else None
    return f"{p}.{spec.family.shared_expert}", gate


def kept_in_float32(spec: ModelSpec, entry: TensorEntry) -> bool:
    """Resident tensors read (and converted) in float32 whatever the compute dtype: attention sinks (they
    join the softmax denominator) and the router's weight and choice bias where the family routes in
    float32 (:attr:`Family.router_float32`: GLM, DeepSeek; a bfloat16 rounding of the scores changes which
    experts a token gets, and transformers routes these in float32)."""
    if entry.name.endswith(".sinks"):
        return True
    return spec.family.router_float32 and entry.category == "router"


def router_bias_name(spec: ModelSpec, i: int) -> str:
    """The router's bias beside its weight (``{p}.router.weight`` -> ``{p}.router.bias``)."""
    return spec.family.router.format(p=spec.family.moe_prefix.format(i=i)).removesuffix(".weight") + ".bias"


def tensor_plan(spec: ModelSpec) -> list[TensorEntry]:
    """All tensors of the model in the checkpoint's naming (experts unfused, or fused where the family
    stores them only so); MXFP4 experts are counted by their dense shapes
    (engine/checkpoint/mxfp4.py checks their ``*_blocks`` / ``*_scales``)."""
    D, V = spec.hidden, spec.vocab_size
    out = [TensorEntry(fn.EMBED, (V, D), "embeddings"), TensorEntry(fn.FINAL_NORM, (D,), "norms")] if spec.head else []
    if spec.head and not spec.tie_word_embeddings:
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
        if spec.family.router_bias:
            out.append(TensorEntry(router_bias_name(spec, i), (spec.num_experts,), "router", i))
        if spec.family.score_bias:
            out.append(TensorEntry(score_bias_name(spec, i), (spec.num_experts,), "router", i))
        if spec.shared_ffn:
            shared, gate = shared_expert_names(spec, i)
            out += _mlp(shared, D, spec.shared_ffn, "shared_experts", i)
            if gate is not None:
                out.append(TensorEntry(gate, (1, D), "shared_experts", i))
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


_QUANTISABLE = ("attention", "dense_mlp", "shared_experts")


def quantisable(entry: TensorEntry) -> bool:
    """Whether ``--resident-weights fp8 / int8`` stores this resident tensor in 8 bits: the matrices of
    attention, dense and shared-expert MLPs and an untied LM head. Embeddings (one row read per token),
    routers (the prefetcher's predictions read them too), norms, biases and gates keep the dtype, and so
    does latent attention's kv_b_proj (its halves fold into the queries and outputs: engine/models/mla.py)."""
    if entry.name == fn.LM_HEAD:
        return True
    if entry.name.endswith(".kv_b_proj.weight"):
        return False
    return entry.category in _QUANTISABLE and len(entry.shape) == 2 and entry.shape[0] > 1


def resident_bytes_by_category(spec: ModelSpec, elem: int, fmt: str = "bf16", active: bool = False,
                               embed_on_host: bool = False) -> dict[str, int]:
    """Device bytes of the non-routed tensors per category, ``elem`` bytes per value, the quantisable
    ones (:func:`quantisable`) at 1 byte plus a float32 scale per row when ``fmt`` is fp8 or int8. With
    ``active``: the bytes one decoded token reads (one embedding row, not the table, unless it is tied).
    ``embed_on_host``: the (untied) embedding table is in host memory and counts nothing here."""
    out = {c: 0 for c in CATEGORIES if c != "routed_experts"}
    for t in tensor_plan(spec):
        if t.category == "routed_experts" or (embed_on_host and t.name == fn.EMBED and not spec.tie_word_embeddings):
            continue
        n = 1
        for s in t.shape:
            n *= s
        if active and t.name == fn.EMBED and not spec.tie_word_embeddings:
            n = spec.hidden
        if fmt in ("fp8", "int8") and quantisable(t):
            out[t.category] += n + 4 * t.shape[0]
        else:
            out[t.category] += n * (4 if kept_in_float32(spec, t) else elem)
    return out


def resident_bytes(spec: ModelSpec, elem: int, fmt: str = "bf16", active: bool = False,
                   embed_on_host: bool = False) -> int:
    """The sum of :func:`resident_bytes_by_category`."""
    return sum(resident_bytes_by_category(spec, elem, fmt, active, embed_on_host).values())


def embedding_bytes(spec: ModelSpec, elem: int) -> int:
    """Bytes of the token embedding table at ``elem`` bytes per value."""
    return spec.vocab_size * spec.hidden * elem


def routed_params_per_expert(spec: ModelSpec) -> int:
    """Weights (and expert biases) of one routed expert."""
    bias = 2 * spec.moe_ffn + spec.hidden if spec.family.expert_bias else 0
    return 3 * spec.hidden * spec.moe_ffn + bias


def active_params_per_token(spec: ModelSpec) -> int:
    """Parameters read to generate one token: everything but the routed experts, plus k of them per MoE layer."""
    c = params_by_category(spec)
    lm_head_rows = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden
    # of the embedding table only one row is read; the LM head is read whole
    embed_read = spec.hidden + (spec.vocab_size * spec.hidden if spec.tie_word_embeddings else lm_head_rows)
    return (c["attention"] + c["norms"] + c["router"] + c["dense_mlp"] + c["shared_experts"]
            + spec.num_moe_layers * spec.top_k * routed_params_per_expert(spec) + embed_read)
