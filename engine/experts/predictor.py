"""``ExpertPredictor``: guesses the experts later MoE layers will route to, from an earlier layer's input.

Each MoE layer routes ``rms_norm(x) * post_norm``; the loader folds the norm weight into the router,
which leaves only a positive per-token scale that top-k ignores, so applying layer ``t``'s router to
the residual stream at an earlier layer guesses ``t``'s experts (a router bias, as in gpt-oss, is
added scaled by the token's RMS; a choice bias on sigmoid scores, as in GLM-4.5, needs the logits
divided by it first: ``sigmoid(logits / rms) + bias``). Decode steps on CUDA predict many layers in one launch
(kernels/predict.py); otherwise one matmul and the model's routing (engine/experts/prefetch.py).

Legend: T tokens, k experts per token, E experts, L MoE layers, D hidden, P layers predicted.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.experts.prefetch import RouteFn, predict_experts, predict_scored
from kernels.predict import MAX_TOKENS as PREDICT_MAX_TOKENS
from kernels.predict import PredictWorkspace, predict_topk
from kernels.predict import available as predict_available


class ExpertPredictor:
    def __init__(self, routers: Sequence[torch.Tensor], route_fn: RouteFn, device: torch.device, top_k: int | None,
                 router_bias: Sequence[torch.Tensor] | None, norm_eps: float, max_layers: int,
                 score_bias: Sequence[torch.Tensor] | None = None) -> None:
        self.routers = torch.stack([r.detach() for r in routers])       # [L, E, D], one matmul predicts many layers
        # [L, E] float32 or None: routers' biases (gpt-oss), which predictions add scaled by the token's RMS
        self.router_bias = None if router_bias is None else torch.stack([b.detach().float() for b in router_bias])
        # [L, E] float32 or None: choice biases on sigmoid scores (GLM)
        self.score_bias = None if score_bias is None else torch.stack([b.detach().float() for b in score_bias])
        self.route_fn, self.top_k, self.norm_eps = route_fn, top_k, norm_eps
        # the one-launch kernel needs k and runs where Triton does (CUDA)
        num_experts = self.routers.shape[1]
        self.workspace = (PredictWorkspace(max_layers, num_experts, device)
                          if top_k and predict_available(device) else None)
        self.use_kernel = self.workspace is not None     # False: matmul + routing (for comparison)

    def predict(self, hidden: torch.Tensor, first: int, count: int) -> torch.Tensor:
        """Expert ids ``[count, T, k]`` of MoE layers ``first .. first + count - 1`` from ``hidden [T, D]``
        (device work, no sync)."""
        ws = self.workspace
        if self.use_kernel and ws is not None and hidden.shape[0] <= PREDICT_MAX_TOKENS and count <= ws.max_layers:
            return predict_topk(hidden, self.routers, first, count, self.top_k, ws, self.router_bias, self.norm_eps,
                                self.score_bias)
        if self.score_bias is not None and self.top_k:
            return predict_scored(hidden, self.routers, first, count, self.top_k, self.score_bias, self.norm_eps)
        return predict_experts(hidden, self.routers, first, count, self.route_fn, self.router_bias, self.norm_eps)
