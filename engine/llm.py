"""``LLM``: the offline Python API (DESIGN.md §9) over ``LLMEngine``."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling import SamplingParams
from engine.telemetry import EngineStats


class LLM:
    """``LLM(model_dir, device=..., dtype=..., expert_pool_size="10G", ...)``."""

    def __init__(self, model: str, **options) -> None:
        self.engine = LLMEngine(EngineConfig(model=str(model), **options))
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        """Run every prompt to completion (batched); outputs in prompt order."""
        params = params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        reqs = {}
        for p in prompts:
            rid = self.engine.add_request(None, p, params)
            reqs[rid] = {"ids": [], "text": [], "ttft": None, "reason": None}
        while self.engine.has_unfinished():
            for d in self.engine.step():
                r = reqs[d.request_id]
                r["ids"] += d.new_token_ids
                r["text"].append(d.new_text)
                r["ttft"] = r["ttft"] if d.ttft_ms is None else d.ttft_ms
                if d.finished:
                    r["reason"] = d.finish_reason
        outs = []
        for (rid, r), p in zip(reqs.items(), prompts):
            prompt_ids = self.tokenizer.encode(p) if isinstance(p, str) else list(p)
            outs.append(RequestOutput(rid, prompt_ids, r["ids"], "".join(r["text"]), r["reason"], r["ttft"]))
        return outs

    def score(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits [T, vocab] for every position of ``token_ids``."""
        return self.engine.score(list(token_ids))

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def reconfigure(self, **options) -> dict[str, str]:
        return self.engine.reconfigure(**options)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
