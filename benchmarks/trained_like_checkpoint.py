"""The benchmarks' "trained-like" model written as a Hugging Face checkpoint, for engines that read folders.

The llama.cpp comparison kit (``run.sh --hf DIR``) measures both engines on a checkpoint it is given; this
writes the Qwen3-30B-A3B-shaped random model reshaped as :mod:`benchmarks.synthetic_moe` describes
(residual-dominated stream, skewed expert popularity), so both engines meet the same skewed routing:

    python benchmarks/trained_like_checkpoint.py /dev/shm/qwen3-L12-trained --layers 12
    bash .bench/kit/run.sh --background --hf /dev/shm/qwen3-L12-trained --shares 50,25,0

Experts are written one tensor per projection (``mlp.experts.{e}.gate_proj.weight`` ...), the layout
checkpoints on the Hub use and GGUF converters read; the tokenizer is the demo model's (timings do not
depend on it). ``trained_like.json`` in the folder records the construction and the routing measured
on the written weights. ``--smoke`` writes the tiny shape on the CPU (what the CI's test runs). The
folder must not exist: nothing is overwritten.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.synthetic_moe import (QWEN3_30B, SMOKE, TrainedLike, base_std, build_hf,  # noqa: E402
                                      make_trained_like, routing_profile)

DEMO = ROOT / "resources" / "models" / "demo"


def per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused expert tensors (``experts.gate_up_proj [E, 2F, D]``, ``experts.down_proj [E, D, F]``) as one
    tensor per expert and projection; everything else as it is."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, f = name[:-len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :f].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, f:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t.contiguous()
    return out


def write(out: Path, shape: dict, dtype: torch.dtype, device: str, knobs: TrainedLike, shard_bytes: int) -> dict:
    from safetensors.torch import save_file
    hf, cfg = build_hf(shape, dtype, base_std(shape), device)
    calib = torch.randint(10, cfg.vocab_size, (4, 64), generator=torch.Generator().manual_seed(2)).to(hf.device)
    construction = make_trained_like(hf, base_std(shape), knobs, calib)
    measured = routing_profile(hf, calib)
    tensors = per_expert({k: v.detach().to("cpu") for k, v in hf.state_dict().items()})
    del hf
    part = out.with_name(out.name + ".part")
    if part.exists():
        shutil.rmtree(part)                       # what a killed earlier run of this script left
    part.mkdir(parents=True)
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(part / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (part / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = {**cfg.to_dict(), "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "torch_dtype": str(dtype).removeprefix("torch."), "bos_token_id": 0, "eos_token_id": 2}
    config.pop("_experts_implementation", None)
    (part / "config.json").write_text(json.dumps(config, indent=2, default=str))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / f, part / f)
    record = {"routing": "trained-like", "construction": construction, "measured": measured, "shape": shape}
    (part / "trained_like.json").write_text(json.dumps(record, indent=1))
    part.rename(out)
    return {"bytes": total, "shards": len(shards), **record}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the folder to write (must not exist)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--smoke", action="store_true", help="the tiny shape, float32, on the CPU")
    a = ap.parse_args()
    out = Path(a.out)
    if out.exists():
        ap.error(f"{out} exists; choose another folder (nothing is overwritten)")
    if a.layers < 1:
        ap.error("--layers must be at least 1")
    shape = dict(SMOKE) if a.smoke else dict(QWEN3_30B, num_hidden_layers=a.layers)
    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    t0 = time.perf_counter()
    got = write(out, shape, torch.float32 if a.smoke else torch.bfloat16, device, TrainedLike(),
                int(a.shard_gb * 1e9))
    print(f"wrote {out}: {got['bytes'] / 1e9:.2f} GB in {got['shards']} shards, top-10% share "
          f"{got['measured'].get('top10_share', float('nan')):.2f}, {time.perf_counter() - t0:.1f} s on {device}")


if __name__ == "__main__":
    main()
