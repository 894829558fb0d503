"""Evidence for resources/models/README.md: held-out perplexity, unigram baseline, routing skew, samples.

    python resources/models/evaluate_demo.py [--model resources/models/demo] [--corpus .carry/demo_corpus]

Runs on CPU with transformers (fp32 compute on the bf16 weights). Writes eval.json beside the model
and prints Markdown tables. Perplexity uses the same windows as train_demo.py (non-overlapping
256-token windows of test.txt, first token of each window unscored).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo import CORPUS_DIR, DEMO_DIR  # noqa: E402
from train_demo import SEQ_LEN, load_tokens, unigram_nll, windows  # noqa: E402

PROMPTS = [
    "In the beginning",
    "The king of Egypt said to Moses,",
    "Jesus answered them,",
    "Blessed is the man who",
    "Then the people of Israel",
]
MAX_NEW_TOKENS = 40
TEMPERATURE = 0.8
SAMPLE_SEED = 0


@torch.no_grad()
def perplexity_and_routing(model, stream: torch.Tensor, batch: int = 32):
    """Mean NLL and, per layer, how many top-k assignments each expert received."""
    cfg = model.config
    experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    counts = torch.zeros(cfg.num_hidden_layers, experts, dtype=torch.long)
    total, n = 0.0, 0
    rows = windows(stream, SEQ_LEN)
    for i in range(0, rows.shape[0], batch):
        x = rows[i : i + batch]
        out = model(input_ids=x, output_router_logits=True)
        logits = out.logits.float()
        total += float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                         x[:, 1:].reshape(-1), reduction="sum"))
        n += x[:, 1:].numel()
        for layer, router_logits in enumerate(out.router_logits):
            top = router_logits.float().topk(cfg.num_experts_per_tok, dim=-1).indices  # softmax keeps order
            counts[layer] += torch.bincount(top.reshape(-1), minlength=experts)
    return total / n, counts


def routing_table(counts: torch.Tensor) -> list[dict]:
    experts = counts.shape[1]
    top_n = max(1, math.ceil(0.1 * experts))
    rows = []
    for layer, c in enumerate(counts):
        share = c.double() / c.sum()
        ordered = share.sort(descending=True).values
        entropy = float(-(share[share > 0] * share[share > 0].log()).sum())
        rows.append({"layer": layer, "top10pct_experts": top_n, "top10pct_share": round(float(ordered[:top_n].sum()), 4),
                     "max_share": round(float(ordered[0]), 4), "min_share": round(float(ordered[-1]), 4),
                     "effective_experts": round(math.exp(entropy), 2)})
    return rows


@torch.no_grad()
def samples(model, tokenizer) -> list[dict]:
    out = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        for temperature in (0.0, TEMPERATURE):
            torch.manual_seed(SAMPLE_SEED)
            kwargs = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                                    "top_k": 0, "top_p": 1.0}
            gen = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=tokenizer.eos_token_id, **kwargs)
            text = tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=False)
            out.append({"prompt": prompt, "temperature": temperature, "continuation": text})
    return out


def main() -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEMO_DIR)
    parser.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    parser.add_argument("--no-samples", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).float().eval()
    raw = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    train, test = load_tokens(raw, args.corpus / "train.txt"), load_tokens(raw, args.corpus / "test.txt")
    nll, counts = perplexity_and_routing(model, test)
    uni = unigram_nll(train, windows(test, SEQ_LEN)[:, 1:].reshape(-1), model.config.vocab_size)
    result = {"test_tokens": int(windows(test, SEQ_LEN)[:, 1:].numel()), "test_ppl": round(math.exp(nll), 3),
              "unigram_test_ppl": round(math.exp(uni), 3), "routing": routing_table(counts),
              "expert_counts": counts.tolist()}
    if not args.no_samples:
        result["samples"] = samples(model, AutoTokenizer.from_pretrained(args.model))
    (args.model / "eval.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"test perplexity {result['test_ppl']} vs unigram {result['unigram_test_ppl']} "
          f"on {result['test_tokens']:,} tokens\n")
    print("| layer | top 10% of experts | their share | max | min | effective experts |\n|---|---|---|---|---|---|")
    for r in result["routing"]:
        print(f"| {r['layer']} | {r['top10pct_experts']} | {r['top10pct_share']:.1%} | {r['max_share']:.1%} | "
              f"{r['min_share']:.1%} | {r['effective_experts']} |")
    for s in result.get("samples", []):
        print(f"\n**{s['prompt']}** (T={s['temperature']}): {s['continuation']!r}")


if __name__ == "__main__":
    main()
