"""Build the bundled demo model's folder: tokenizer, Qwen3-MoE config, weights, STRATA_DEMO.json marker.

    python resources/models/build_corpus.py        # once: the corpus (needs sword-text-web, diatheke)
    python resources/models/make_demo.py --random  # tokenizer + random weights into resources/models/demo
    python resources/models/train_demo.py          # trained weights (GPU), same tokenizer and config

The shapes below are the single source of truth; train_demo.py imports them.
Parameter count (V vocab, D hidden, L layers, E experts, I expert width, H/K q/kv heads, d head dim):
    embedding (tied with the LM head)  V*D                   = 4096*128         =   524,288
    attention per layer                D*d*(2H+2K)           = 128*32*12        =    49,152
    router per layer                   E*D                   = 16*128           =     2,048
    experts per layer                  E*3*D*I               = 16*3*128*128     =   786,432
    norms per layer (+ q/k norms)      2*D + 2*d                                =       320
    total                              V*D + L*(...) + D     = 524,288 + 6*837,952 + 128 = 5,552,128
    -> 11.1 MB in bf16, under the 12 MB limit.
D and I are multiples of 128 so that every reduction dimension of the routed experts (D for gate/up,
I for down) divides into int4 groups of 128 (and of 32 and 64).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO_DIR = REPO / "resources" / "models" / "demo"
CORPUS_DIR = REPO / ".carry" / "demo_corpus"
SIZE_LIMIT_BYTES = 12_000_000

VOCAB_SIZE = 4096
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]
# The model is a base model: the template only wraps turns; STRATA_DEMO.json says completion_only.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=16,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    intermediate_size=384,  # unused: every layer is sparse (decoder_sparse_step=1, no mlp_only_layers)
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    initializer_range=0.02,
    router_aux_loss_coef=0.001,
    output_router_logits=False,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)


def train_tokenizer(train_file: Path):
    """Byte-level BPE over the training split only; special tokens take ids 0..2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(train_file)], trainer)
    return tokenizer


def save_tokenizer(tokenizer, out: Path) -> None:
    """tokenizer.json from `tokenizers`; tokenizer_config.json written by hand so it is version-stable."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": MODEL_CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def build_config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**MODEL_CONFIG)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def write_marker(out: Path, random_weights: bool, **extra) -> None:
    marker = {
        "demo": True,
        "random_weights": random_weights,
        "name": "strata-demo-moe",
        "architecture": "Qwen3MoeForCausalLM",
        "completion_only": True,
        "corpus": "World English Bible (public domain), see resources/models/README.md",
        "description": "A small demo Mixture-of-Experts model bundled with Strata. "
                       "Open a real checkpoint with --model PATH.",
        **extra,
    }
    (out / "STRATA_DEMO.json").write_text(json.dumps(marker, indent=2) + "\n")


def add_hub_keys(out: Path) -> None:
    """Recent transformers write `num_local_experts`; Qwen3-MoE checkpoints on the Hub say `num_experts`.
    Write both so readers that know only the Hub spelling (and older transformers) agree."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    experts = config.get("num_experts", config.get("num_local_experts"))
    config["num_experts"] = config["num_local_experts"] = experts
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def folder_bytes(out: Path) -> int:
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file())


def make_random(out: Path, corpus: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3MoeForCausalLM

    train_file = corpus / "train.txt"
    if not train_file.exists():
        raise SystemExit(f"{train_file} missing: run resources/models/build_corpus.py first")
    save_tokenizer(train_tokenizer(train_file), out)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(build_config()).to(torch.bfloat16)
    model.save_pretrained(out)
    add_hub_keys(out)
    write_marker(out, random_weights=True, parameters=count_parameters(model), seed=seed)
    print(f"wrote {out}: {count_parameters(model):,} parameters, {folder_bytes(out):,} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", action="store_true", help="random weights (the trained ones come from train_demo.py)")
    parser.add_argument("--out", type=Path, default=DEMO_DIR)
    parser.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.random:
        parser.error("only --random is built here; run train_demo.py for trained weights")
    make_random(args.out, args.corpus, args.seed)


if __name__ == "__main__":
    main()
