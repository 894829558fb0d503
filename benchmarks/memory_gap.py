"""What the card holds for a Strata process beyond torch's allocator, phase by phase.

The llama.cpp kit reads GPU memory as nvidia-smi does (everything the process holds), where
benchmarks/memory_profile.py reads torch's allocator. This script loads a checkpoint folder as the kit
does (its KV sizing, a share of the experts in the pool) and records, after each phase, the card's used
memory over its idle figure (NVML), torch's reserved and allocated bytes, and their difference: the CUDA
context, the kernels' code, and the local memory the driver keeps for every thread the card can hold
for the kernel that needs the most of it (spilled registers, stacks). Last, each Triton kernel the run
compiled with its registers, spills and local bytes per thread, largest reservation first:

    python benchmarks/memory_gap.py --hf DIR --format int4 --pool 0 --out gap.json

``--smoke`` builds a tiny checkpoint and runs on the CPU (checks the script; measures nothing).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import warnings
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.memory_profile import kit_kv  # noqa: E402

MIB = 1 << 20
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3


class CardMemory:
    """Used bytes of GPU 0 over its figure when this object was made (before CUDA starts here)."""

    def __init__(self) -> None:
        self.handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.idle = self.used_raw()
        except Exception:  # noqa: BLE001 - no NVML (the CPU): figures are None
            self.idle = 0

    def used_raw(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def used(self) -> int | None:
        return None if self.handle is None else self.used_raw() - self.idle


def live_tensors(device: torch.device, top: int = 40) -> list[dict]:
    """The tensors on ``device`` that something still refers to (largest first), each with the kinds
    of object that refer to it: what a closed engine failed to let go of."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # isinstance on deprecated module attributes warns
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.Tensor) and o.device.type == device.type:
                    found.append(o)
            except Exception:  # noqa: BLE001 - objects that cannot be inspected
                continue
    found.sort(key=lambda t: -t.untyped_storage().nbytes())
    shown = tuple(found[:top])
    del found
    rows = []
    for t in shown:
        holders = [type(r).__qualname__ + (f" ({', '.join(k for k in list(r)[:4] if isinstance(k, str))})"
                                           if isinstance(r, dict) else "")
                   for r in gc.get_referrers(t) if r is not shown]
        rows.append({"shape": list(t.shape), "dtype": str(t.dtype), "mib": t.untyped_storage().nbytes() / MIB,
                     "held_by": holders[:4]})
    return rows


def snapshot(card: CardMemory, phase: str, cuda: bool) -> dict:
    # peak_mib: torch's largest allocated bytes since the phase before
    row = {"phase": phase, "card_mib": None, "reserved_mib": 0.0, "allocated_mib": 0.0, "peak_mib": 0.0}
    if cuda:
        torch.cuda.synchronize()
        row.update(reserved_mib=torch.cuda.memory_reserved() / MIB, allocated_mib=torch.cuda.memory_allocated() / MIB,
                   peak_mib=torch.cuda.max_memory_allocated() / MIB)
    used = card.used()
    if used is not None:
        row["card_mib"] = used / MIB
        row["outside_torch_mib"] = (used - torch.cuda.memory_reserved()) / MIB
    print(f"{phase:34s} card {row['card_mib'] or 0:8.0f} MiB  reserved {row['reserved_mib']:8.0f}  allocated "
          f"{row['allocated_mib']:8.0f}  peak {row['peak_mib']:8.0f}  "
          f"outside torch {row.get('outside_torch_mib', 0):6.0f}", flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()          # each phase's peak is its own (a load's apart from a step's)
    return row


def compiled_kernels() -> list[tuple[str, object]]:
    """(name, CompiledKernel) of every Triton kernel of the project's kernel modules compiled so far."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    seen, out = set(), []
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("kernels") or mod is None:
            continue
        for attr in vars(mod).values():
            fn = attr if isinstance(attr, JITFunction) else getattr(attr, "fn", None)
            if not isinstance(fn, JITFunction) or id(fn) in seen:
                continue
            seen.add(id(fn))
            for cache in getattr(fn, "device_caches", {}).values():
                table = cache[0] if isinstance(cache, tuple) else cache
                for kernel in (table.values() if isinstance(table, dict) else ()):
                    out.append((fn.__name__, kernel))
    return out


def kernel_rows(threads_per_card: int) -> list[dict]:
    """Registers, spills and local bytes per thread of each compiled kernel; the local memory the driver
    reserves for it is that times every thread the card can hold."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        cuda = None
    rows = []
    for name, k in compiled_kernels():
        local = None
        try:
            k._init_handles()
            if cuda is not None:
                value = ctypes.c_int(0)
                if cuda.cuFuncGetAttribute(ctypes.byref(value), CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                           ctypes.c_void_p(k.function)) == 0:
                    local = value.value
        except Exception:  # noqa: BLE001 - a kernel that cannot be asked: its row says so
            pass
        meta = getattr(k, "metadata", None)
        rows.append({"kernel": name, "regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None),
                     "shared": getattr(meta, "shared", None), "warps": getattr(meta, "num_warps", None),
                     "local_bytes_per_thread": local,
                     "local_reservation_mib": None if local is None else local * threads_per_card / MIB})
    return sorted(rows, key=lambda r: -(r["local_reservation_mib"] or 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", default=None, help="checkpoint folder (e.g. benchmarks/trained_like_checkpoint.py's)")
    ap.add_argument("--format", default="int4")
    ap.add_argument("--pool", default="0%", help="expert_pool_size, as the kit gives it")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--resident-weights", default="auto")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batch-prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--sequence", default=None,
                    help="engines loaded in turn in this process, FORMAT:POOL,... (e.g. the kit's offload rows: "
                         "bf16:50%%,bf16:25%%,bf16:0%%,int4:50%%,int4:25%%,int4:0%%); default: --format at --pool")
    ap.add_argument("--smoke", action="store_true", help="a tiny checkpoint on the CPU: checks the script")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    card = CardMemory()                     # before CUDA starts in this process
    cuda = not a.smoke and torch.cuda.is_available()
    rows = []
    if cuda:
        torch.zeros(1, device="cuda")
        rows.append(snapshot(card, "CUDA context (torch)", cuda))
    import importlib
    importlib.import_module("triton")       # its driver and the engine's modules: what every load pays
    from engine import LLM, SamplingParams
    rows.append(snapshot(card, "engine imported", cuda))
    folder = a.hf
    if a.smoke:
        a.prompt, a.batch_prompt, a.gen = 64, 16, 8
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tiny_models import build_tiny_model
        folder = str(build_tiny_model(Path(tempfile.mkdtemp()) / "m", "qwen3_moe"))
    if folder is None:
        ap.error("--hf DIR is needed (or --smoke)")
    import json
    cfg = json.loads((Path(folder) / "config.json").read_text())
    shape = {"num_hidden_layers": cfg["num_hidden_layers"], "num_key_value_heads": cfg["num_key_value_heads"],
             "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]}
    scenarios = [(1, a.prompt), (a.batch, a.batch_prompt)]
    kv = kit_kv(shape, scenarios, a.gen, cuda)
    # the engines of the run, one after the other in this process (the kit's offload rows run so)
    engines = [tuple(item.split(":", 1)) for item in a.sequence.split(",")] if a.sequence else [(a.format, a.pool)]
    if any(len(e) != 2 or not all(e) for e in engines):
        ap.error(f"--sequence takes FORMAT:POOL items separated by commas, e.g. int4:0%,bf16:50% (got {a.sequence!r})")
    memory = None
    for fmt, pool in engines:
        label = f"{fmt} pool {pool}: " if a.sequence else ""
        options = dict(weight_format=fmt, expert_pool_size=pool, prefetch_depth=a.depth, max_batch=a.batch,
                       resident_weights=a.resident_weights, **kv)
        if a.smoke:
            options.update(device="cpu", dtype="float32", group_size=32, weight_format="int4")
        llm = LLM(folder, **options)
        rows.append(snapshot(card, f"{label}loaded", cuda))
        g = torch.Generator().manual_seed(0)
        for batch, plen in scenarios:
            prompts = torch.randint(10, cfg["vocab_size"], (batch, plen), generator=g).tolist()
            llm.generate(prompts, SamplingParams(max_tokens=a.gen, temperature=1.0, seed=1, ignore_eos=True))
            rows.append(snapshot(card, f"{label}{batch} x {plen}-token prompts, {a.gen} tokens", cuda))
        memory = llm.stats().memory
        llm.close()
        if not a.sequence:
            rows.append(snapshot(card, "closed (the engine object still held)", cuda))
        del llm
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        rows.append(snapshot(card, f"{label}closed, dropped, collected, cache emptied", cuda))
    left = live_tensors(torch.device("cuda" if cuda else "cpu"))
    for t in left[:10]:
        print(f"  still held: {t['shape']} {t['dtype']} {t['mib']:.1f} MiB, held by {', '.join(t['held_by'])}")
    threads = 0
    if cuda:
        p = torch.cuda.get_device_properties(0)
        threads = p.multi_processor_count * p.max_threads_per_multi_processor
    kernels = kernel_rows(threads) if cuda else []
    for k in kernels[:15]:
        print(f"  {k['kernel'][:40]:40s} regs {k['regs']}  spills {k['spills']}  local {k['local_bytes_per_thread']} B"
              f"/thread -> {k['local_reservation_mib'] or 0:.0f} MiB")
    import dataclasses
    result = {"benchmark": "memory_gap", "what": (
        "GPU memory of one Strata process as the card counts it (NVML, over the idle card) against torch's "
        f"reserved and allocated bytes, per phase: {a.sequence or a.format + ' experts, pool ' + a.pool} (engines "
        f"in turn), depth {a.depth}, resident "
        f"weights {a.resident_weights}, the kit's KV sizing; and the compiled Triton kernels' local memory"),
        "config": vars(a), "phases": rows, "kernels": kernels, "held_after_close": left,
        "engine_memory": dataclasses.asdict(memory) if dataclasses.is_dataclass(memory) else None}
    if a.out:
        write_result(a.out, result)


if __name__ == "__main__":
    main()
