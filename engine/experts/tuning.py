"""``ResidencyTuning``: the residency's measured launch and policy settings, passed in as one object.

Nothing here is a setting a user chooses (those are live options in ``engine/config.py``); these are
thresholds that were measured once and are kept with their reasons, so a benchmark or a test can try
another value without patching a module global.
"""
from __future__ import annotations

import dataclasses

from engine.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ResidencyTuning:
    # Decode steps of at most this many tokens read missing experts straight from the mapped host
    # store (direct reads); larger steps copy them into the pool first. The MoE kernels' decode tiles
    # (kernels/fused_moe.py) are tuned for steps this small; past it each expert is read once per
    # token that uses it, and copying once per step moves fewer bytes.
    direct_max_tokens: int = 16
    # Share of GPU-side prefetch claims that must be used for claiming to go on; below it claims
    # pause (probe steps still measure). Measured on the H200 (Qwen3-30B-A3B shape, bf16, 50% pool,
    # depth 2): claims used 28% of the time at batch 1 make the step slower than no claims at all
    # (9.4-10.1 against 8.3-8.9 ms per token), at 61-63% (batch 8) faster (4.04 against 4.3-4.4 ms).
    device_prefetch_threshold: float = 0.4
    # Most GPU-side prefetch claims per predicted layer: a second claim is used 20% of the time at
    # batch 8 and makes the step slower (4.5 against 4.0 ms), so it stays 1.
    prefetch_per_layer: int = 1
    # Predicted layers one launch of the prediction kernel (kernels/predict.py) covers; its
    # workspace is sized for this many.
    predict_max_layers: int = 8
    # Direct-read steps of two or more tokens copy each missing expert that several of their tokens
    # use once, before the layer's kernels (engine/experts/gather.py), instead of reading it over the
    # bus once per token. At batch 8 with no pool, reads per token moved 904 MB against 738 for one
    # copy per expert (Qwen3-30B-A3B shape, bf16, H200). Read when the expert manager is made.
    gather_shared: bool = True
    # A gathered expert is one that at least this many of a step's real tokens use. 1: every missing
    # expert of a direct-read step, one-token steps included, is copied in by the gather's copy kernel
    # before the layer's MoE kernels, which then read device memory. 2: an expert one token uses is read
    # by the kernels themselves (it crosses the bus once either way, but their reads of host memory ran
    # at about 20 GB/s on the H100 host against 55 GB/s for copies). At no pool on that host (int4,
    # benchmarks/results/gather_ab_2026-12-05b.json) 1 against 2: batch 1 at depth 0 164 against 144
    # tok/s (cold experts auto) and 101 against 87 (bus alone); batch 8 321 against 315 and 138 against 123.
    gather_min_uses: int = 1
    # Share of the free staging slots a direct-read step may lease as fill slots (engine/experts/fills.py).
    # 1.0 leases them all: on gpt-oss-120b at 24G, batch 4 (64 staging slots) a fill step then left the
    # next replayed step no staging, so it gathered nothing and read every missing expert directly, and
    # steps alternated between the two (a profile of four steps, gpt_oss_2026-12-07c.json). Below 1 a
    # step leaves the rest to the next one's gathers. 0.5 against 1.0 on that model, trained-like, in two
    # runs with the order turned round (gpt_oss_cold_ab_2026-12-07*.json, H100): batch 16 126.0 against
    # 85.8 and 122.9 against 108.0 tok/s, batch 4 91.6 against 85.0, batch 1 even (50.0/51.0 against 51.4).
    fill_share: float = 0.5
    # Where a replayed step's first layer gives the host CPU experts, the previous step's deferred end
    # runs after those experts (False), while the GPU already waits at the second layer's join when
    # that one has a share too (1.3-2.7 ms in that profile); True: after the step's last layer instead.
    end_late: bool = False
    # Each replayed recording (quiet, predicting) has its own CPU share tuner (engine/experts/cold_graph.py),
    # so neither is judged at the share tuned for the other; False: one for both, as before it had two
    # (benchmarks/predict_ab.py's ``tuned1``). Read when a step is first recorded.
    share_per_recording: bool = True

    def __post_init__(self) -> None:
        if self.direct_max_tokens < 0 or self.prefetch_per_layer < 0 or self.predict_max_layers < 1 \
                or self.gather_min_uses < 1:
            raise ConfigError(f"residency tuning out of range: {self}; token, claim and layer counts are "
                              "non-negative (at least one predicted layer, one use for a gather)")
        if not 0.0 <= self.fill_share <= 1.0:
            raise ConfigError(f"fill share {self.fill_share} is a share of the free staging slots; give a value "
                              "from 0 to 1")
        if not 0.0 <= self.device_prefetch_threshold <= 1.0:
            raise ConfigError(f"device prefetch threshold {self.device_prefetch_threshold} is a share; "
                              "give a value from 0 to 1")
