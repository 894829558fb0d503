"""Weights of the generic MoE transformer, grouped as the forward uses them.

Everything here is resident on the compute device, but for an embedding table kept in host memory. Routed experts are not here: they live in an
expert provider (engine/experts), addressed by MoE layer index.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.qlinear import QuantWeight

Matrix = torch.Tensor | QuantWeight      # a resident matrix: in the dtype, or 8 bits with row scales


@dataclass
class AttentionWeights:
    qkv: Matrix                          # [(H + 2 Hkv) * hd, D]  q, k and v projections stacked
    o: Matrix                            # [D, H * hd]
    qkv_bias: torch.Tensor | None = None  # [(H + 2 Hkv) * hd]
    q_norm: torch.Tensor | None = None   # [hd] (per head) or [H * hd] (whole projection)
    k_norm: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None   # [D]
    sinks: torch.Tensor | None = None    # [H] float32: a sink logit per query head (gpt-oss)
    window: int = 0                      # sliding window in tokens (0: full attention)
    # DeepSeek's latent attention (engine/models/mla.py): qkv then stacks the query projection (or its
    # low-rank first half) and the latent with the rotary key, [q_rows + r + p, D]; q_norm is the
    # low-rank queries' norm and k_norm the latent's
    q_b: Matrix | None = None            # [H * (n + p), q_lora_rank] the queries' second half
    kv_up_k: torch.Tensor | None = None  # [H, n, r] the keys' up-projection, folded into the queries
    kv_up_v: torch.Tensor | None = None  # [H, v, r] the values' up-projection, folded into the outputs


@dataclass
class MLPWeights:
    gate_up: Matrix                      # [2F, D] gate rows then up rows
    down: Matrix                         # [D, F]


@dataclass
class MoEWeights:
    moe_index: int                       # index among MoE layers (the provider's layer id)
    router: torch.Tensor                 # [E, D]
    shared: MLPWeights | None = None
    shared_gate: torch.Tensor | None = None  # [1, D], sigmoid gate of the shared expert
    router_bias: torch.Tensor | None = None  # [E]
    score_bias: torch.Tensor | None = None   # [E] float32: added to the scores to choose experts (GLM), not to weigh them


@dataclass
class LayerWeights:
    input_norm: torch.Tensor             # [D]
    post_norm: torch.Tensor              # [D]
    attn: AttentionWeights
    mlp: MLPWeights | None = None        # dense layer
    moe: MoEWeights | None = None        # MoE layer


@dataclass
class ModelWeights:
    embed: torch.Tensor                  # [V, D]
    final_norm: torch.Tensor             # [D]
    lm_head: Matrix                      # [V, D] (the embedding itself when tied)
    layers: list[LayerWeights] = field(default_factory=list)
    # the embedding table is in page-locked host memory, mapped for the GPU, which gathers its rows
    embed_on_host: bool = False

    def resident_bytes(self) -> int:
        """Bytes of all resident tensors on the device (tied embeddings counted once; a table in host
        memory not at all)."""
        seen: set[int] = set()
        total = 0

        def add(t: Matrix | None) -> None:
            nonlocal total
            if isinstance(t, QuantWeight):
                add(t.q)
                add(t.scale)
            elif t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()

        for t in (None if self.embed_on_host else self.embed, self.final_norm, self.lm_head):
            add(t)
        for layer in self.layers:
            a = layer.attn
            for t in (layer.input_norm, layer.post_norm, a.qkv, a.o, a.qkv_bias, a.q_norm, a.k_norm, a.o_bias,
                      a.sinks, a.q_b, a.kv_up_k, a.kv_up_v):
                add(t)
            for m in (layer.mlp, layer.moe.shared if layer.moe else None):
                if m is not None:
                    add(m.gate_up)
                    add(m.down)
            if layer.moe is not None:
                add(layer.moe.router)
                add(layer.moe.router_bias)
                add(layer.moe.score_bias)
                add(layer.moe.shared_gate)
        return total
