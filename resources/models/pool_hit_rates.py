"""Hit rate of an LRU expert pool holding 25% / 50% of the demo model's experts, from Strata's counters.

    python resources/models/pool_hit_rates.py [--device cpu] [--corpus .carry/demo_corpus]

Prompts are the first 48 tokens of held-out test chapters; each is continued greedily for 64 tokens,
all prompts in one batch. The counters include prefill and decode.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.llm import LLM  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

DEMO = REPO / "resources" / "models" / "demo"
PROMPTS = 8
PROMPT_TOKENS = 48
NEW_TOKENS = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--corpus", type=Path, default=REPO / ".carry" / "demo_corpus")
    args = parser.parse_args()
    cfg = json.loads((DEMO / "config.json").read_text())
    experts = cfg["num_hidden_layers"] * cfg["num_experts"]
    expert_bytes = 3 * cfg["hidden_size"] * cfg["moe_intermediate_size"] * 2  # bf16 gate, up, down
    chapters = (args.corpus / "test.txt").read_text(encoding="utf-8").split("\n\n")[1 : 1 + PROMPTS]
    rows = []
    for fraction in (0.25, 0.5):
        slots = int(fraction * experts)
        with LLM(str(DEMO), device=args.device, expert_pool_size=slots * expert_bytes,
                 expert_policy="lru", prefetch_depth=0) as llm:
            prompts = [llm.tokenizer.encode(c)[:PROMPT_TOKENS] for c in chapters]
            llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))
            s = llm.stats().experts
        rows.append({"pool_fraction": fraction, "pool_slots": s.pool_slots_total, "hits": s.hits,
                     "misses": s.misses, "hit_rate": round(s.hit_rate, 4),
                     "per_layer_hit_rate": [round(r, 3) for r in s.per_layer_hit_rate]})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
