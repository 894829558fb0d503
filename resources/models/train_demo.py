"""Train the bundled demo model (Qwen3-MoE, shapes in make_demo.py) on the corpus from build_corpus.py.

    python resources/models/train_demo.py --out resources/models/demo       # GPU, ~1.5 minutes
    python resources/models/train_demo.py --max-steps 5 --out /tmp/demo     # CPU smoke test

Reads the committed tokenizer (resources/models/demo/tokenizer.json) and .carry/demo_corpus/{train,val,test}.txt.
Trains on train.txt only; selects the checkpoint with the lowest val.txt loss; reports test.txt perplexity
against the unigram baseline (train-split token frequencies, add-one smoothed). Stops on a wall-clock
deadline and still saves. Works with transformers 5.17 and 5.24.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo import CORPUS_DIR, DEMO_DIR, EOS, MODEL_CONFIG, add_hub_keys, count_parameters, write_marker  # noqa: E402

# ---- hyper-parameters -------------------------------------------------------------------------
SEED = 1234
SEQ_LEN = 256               # tokens per training window
BATCH = 64                  # windows per step (16,384 tokens)
PEAK_LR = 3e-3
MIN_LR_FRACTION = 0.1       # cosine decays to PEAK_LR * this
WARMUP_STEPS = 100
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
ROUTER_AUX_LOSS_COEF = 0.001  # standard load-balancing loss, kept small so routing stays skewed
EPOCHS = 24                 # passes over train.txt (the better of 8 and 24 on validation in an earlier run);
                            # the corpus is small, so the val-best checkpoint is kept
MAX_STEPS = 20_000          # upper bound
TIME_BUDGET_S = 82.0        # wall-clock training budget (the deadline)
TIMING_STEPS = 30           # steps measured to size the schedule to the budget
EVAL_EVERY = 50             # steps between validation passes
# -----------------------------------------------------------------------------------------------


def load_tokens(tokenizer, path: Path) -> torch.Tensor:
    """Chapters (blank-line separated) joined with EOS between them, as one token stream."""
    eos_id = tokenizer.token_to_id(EOS)
    docs = [d for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    ids: list[int] = []
    for enc in tokenizer.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def unigram_nll(train: torch.Tensor, test: torch.Tensor, vocab: int) -> float:
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[test].mean())


def windows(stream: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows covering the stream (the tail shorter than `length` is dropped)."""
    n = stream.numel() // length
    return stream[: n * length].view(n, length)


@torch.no_grad()
def mean_nll(model, stream: torch.Tensor, device, batch: int = 64) -> float:
    """Mean next-token NLL over non-overlapping SEQ_LEN windows (each window's first token unscored)."""
    model.eval()
    total, count = 0.0, 0
    rows = windows(stream, SEQ_LEN)
    for i in range(0, rows.shape[0], batch):
        x = rows[i : i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                x[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
        count += x[:, 1:].numel()
    model.train()
    return total / count


def lr_at(step: int, total: int) -> float:
    if step < WARMUP_STEPS:
        return PEAK_LR * (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, total - WARMUP_STEPS))
    return PEAK_LR * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_model(device, experts_implementation: str | None):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    extra = {"experts_implementation": experts_implementation} if experts_implementation else {}
    config = Qwen3MoeConfig(**{**MODEL_CONFIG, "router_aux_loss_coef": ROUTER_AUX_LOSS_COEF,
                               "output_router_logits": True}, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    return Qwen3MoeForCausalLM(config).to(device)


def build_fast_model(device):
    """grouped_mm experts on the GPU (one kernel for all experts) where this transformers has it."""
    if device.type != "cuda":
        return build_model(device, None)
    try:
        model = build_model(device, "grouped_mm")
        x = torch.randint(0, MODEL_CONFIG["vocab_size"], (2, 16), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=x, labels=x).loss.backward()
        model.zero_grad(set_to_none=True)
        return build_model(device, "grouped_mm")  # fresh, identically seeded weights
    except Exception as exc:  # older transformers or torch: fall back to the per-expert loop
        print(f"grouped_mm experts unavailable ({exc!r}); using the default loop", flush=True)
        return build_model(device, None)


def save_curve(out: Path, curve: list[dict]) -> None:
    (out / "loss_curve.json").write_text(json.dumps(curve, indent=1) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    train = [(c["tokens"], c["train_loss"]) for c in curve if "train_loss" in c]
    val = [(c["tokens"], c["val_loss"]) for c in curve if "val_loss" in c]
    ax.plot(*zip(*train), label="train (batch)", lw=0.8)
    if val:
        ax.plot(*zip(*val), "o-", label="validation", ms=3)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("Strata demo MoE")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss_curve.png", dpi=110)


def train(args) -> None:
    from tokenizers import Tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    data = {name: load_tokens(tokenizer, args.corpus / f"{name}.txt") for name in ("train", "val", "test")}
    print({k: v.numel() for k, v in data.items()}, "tokens", flush=True)
    import transformers

    model = build_fast_model(device)
    print(f"{count_parameters(model):,} parameters on {device}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=BETAS, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(SEED)
    train_stream = data["train"]
    total = min(args.max_steps, math.ceil(args.epochs * train_stream.numel() / (BATCH * SEQ_LEN)))
    curve: list[dict] = []
    best = (float("inf"), -1, None)
    start = time.perf_counter()
    step = 0
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total)
        starts = torch.randint(0, train_stream.numel() - SEQ_LEN, (BATCH,), generator=gen)
        x = torch.stack([train_stream[s : s + SEQ_LEN] for s in starts.tolist()]).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.perf_counter() - start
        if step == TIMING_STEPS and device.type == "cuda":
            torch.cuda.synchronize()
            per_step = (time.perf_counter() - start) / step
            total = min(total, int(args.time_budget / per_step))
            print(f"{per_step * 1e3:.1f} ms/step, {BATCH * SEQ_LEN / per_step:,.0f} tok/s -> {total} steps", flush=True)
        if step % 10 == 0 or step == total:
            aux = getattr(out, "aux_loss", None)
            curve.append({"step": step, "tokens": step * BATCH * SEQ_LEN, "train_loss": float(out.loss.detach()),
                          "aux_loss": float(aux.detach()) if aux is not None else None, "lr": lr_at(step - 1, total),
                          "elapsed_s": round(elapsed, 2)})
        if step % EVAL_EVERY == 0 or step == total or elapsed > args.time_budget * 1.1:
            val = mean_nll(model, data["val"], device)
            curve.append({"step": step, "tokens": step * BATCH * SEQ_LEN, "val_loss": val, "elapsed_s": round(elapsed, 2)})
            print(f"step {step}/{total} train {float(out.loss.detach()):.3f} val {val:.3f} ppl {math.exp(val):.1f} "
                  f"{elapsed:.0f}s", flush=True)
            if val < best[0]:
                best = (val, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            if elapsed > args.time_budget * 1.1:  # deadline: stop and save whatever we have
                print("deadline reached", flush=True)
                break
    finish(args, model, best, curve, data, device, tokens_seen=step * BATCH * SEQ_LEN,
           seconds=time.perf_counter() - start)


def finish(args, model, best, curve, data, device, tokens_seen: int, seconds: float) -> None:
    val, best_step, state = best
    if state is not None:
        model.load_state_dict(state)
    model = model.to(torch.bfloat16)
    test_nll = mean_nll(model, data["test"], device)
    uni = unigram_nll(data["train"], windows(data["test"], SEQ_LEN)[:, 1:].reshape(-1), MODEL_CONFIG["vocab_size"])
    stats = {"test_ppl": round(math.exp(test_nll), 3), "unigram_test_ppl": round(math.exp(uni), 3),
             "val_ppl": round(math.exp(val), 3), "best_step": best_step, "tokens_seen": tokens_seen,
             "epochs": round(tokens_seen / data["train"].numel(), 2), "train_seconds": round(seconds, 1), "train_tokens": data["train"].numel(),
             "tokens_per_second": round(tokens_seen / seconds), "seed": SEED,
             "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    print(json.dumps(stats), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.config.output_router_logits = False
    model.config.router_aux_loss_coef = MODEL_CONFIG["router_aux_loss_coef"]
    model.cpu().save_pretrained(args.out)
    add_hub_keys(args.out)
    for leftover in ("chat_template.jinja",):
        (args.out / leftover).unlink(missing_ok=True)
    if args.copy_tokenizer and args.out.resolve() != args.tokenizer.resolve():
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(args.tokenizer / name, args.out / name)
    write_marker(args.out, random_weights=False, parameters=count_parameters(model),
                 router_aux_loss_coef_trained=ROUTER_AUX_LOSS_COEF, training=stats)
    save_curve(args.out, curve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEMO_DIR)
    parser.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    parser.add_argument("--tokenizer", type=Path, default=DEMO_DIR)
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--epochs", type=float, default=EPOCHS)
    parser.add_argument("--time-budget", type=float, default=TIME_BUDGET_S)
    parser.add_argument("--no-copy-tokenizer", dest="copy_tokenizer", action="store_false")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
