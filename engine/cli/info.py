"""``info``: what a model is made of, what one token costs, and how it fits a GPU budget."""
from __future__ import annotations

import argparse
import sys

import torch

from engine.checkpoint.plan import CATEGORIES, active_params_per_token, params_by_category
from engine.checkpoint.spec import ModelSpec, read_spec
from engine.cli.options import engine_options, model_dir
from engine.config import EngineConfig, format_size, parse_pool_size, parse_size
from engine.experts.layout import ExpertLayout
from engine.memory import BudgetAdvice, default_budget, plan_memory
from engine.settings_fit import depth_note, fit_to_model

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PCIE_GEN4_GB_S = 25.0         # pinned host->device on a PCIe 4.0 x16 card, for the copy-bound estimate


def expert_bytes(spec: ModelSpec, fmt: str, group: int) -> int:
    return ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, group).nbytes


def plan_lines(spec: ModelSpec, args: argparse.Namespace) -> list[str]:
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype
    wb = _BYTES[dtype]
    fmt = {"auto": "bf16" if wb == 2 else "fp32"}.get(args.weight_format, args.weight_format)
    per_expert = expert_bytes(spec, fmt, args.group_size)
    n_experts = spec.num_moe_layers * spec.num_experts
    counts = params_by_category(spec)
    lines = [f"model        {spec.name}  ({spec.architecture}, family {spec.family.name})",
             f"layers       {spec.num_layers} ({spec.num_moe_layers} MoE), {spec.num_experts} experts, top-{spec.top_k}, "
             f"hidden {spec.hidden}, expert FFN {spec.moe_ffn}",
             "", f"{'category':<16}{'parameters':>16}{'bytes':>14}"]
    resident = 0
    for cat in CATEGORIES:
        nbytes = n_experts * per_expert if cat == "routed_experts" else counts[cat] * wb
        resident += 0 if cat == "routed_experts" else nbytes
        lines.append(f"{cat:<16}{counts[cat]:>16,}{format_size(nbytes):>14}")
    total_params = sum(counts.values())
    lines.append(f"{'total':<16}{total_params:>16,}{format_size(resident + n_experts * per_expert):>14}")
    active = active_params_per_token(spec)
    routed_active = spec.num_moe_layers * spec.top_k * per_expert
    active_bytes = (active - spec.num_moe_layers * spec.top_k * 3 * spec.hidden * spec.moe_ffn) * wb + routed_active
    lines += ["", f"active per token: {active:,} parameters, {format_size(active_bytes)} "
                  f"(routed experts {format_size(routed_active)} in {fmt})"]
    lines += _budget_lines(spec, args, resident, per_expert, n_experts, wb)
    return lines


def _budget_lines(spec, args, resident: int, per_expert: int, n_experts: int, wb: int) -> list[str]:
    """The engine's own memory plan for the budget given (or the card's free memory)."""
    budget = parse_size(args.gpu_memory_budget, "gpu_memory_budget")
    card_free = default_budget(torch.device("cuda")) if torch.cuda.is_available() else None
    budget = card_free if budget is None else budget
    if budget is None:
        return ["", "GPU budget: none given and no CUDA GPU found; pass --gpu-memory-budget 24G to plan for a card"]
    kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * wb
    total = per_expert * n_experts
    advice = BudgetAdvice(card_free if args.gpu_memory_budget is None else None,
                          "" if args.weight_format == "int4" else "use --weight-format int4",
                          "use --dtype bfloat16" if wb == 4 else "")
    plan = plan_memory(resident, per_expert, n_experts, kv_per_token, budget,
                       parse_pool_size(args.expert_pool_size, total), experts_per_layer=spec.num_experts,
                       active_experts_per_token=spec.num_moe_layers * spec.top_k, advice=advice)
    lines = ["", *plan.format(bus_gb_s=PCIE_GEN4_GB_S)]
    if plan.pool_slots < plan.num_experts:
        reads = getattr(args, "expert_reads", "auto")
        lines.append("missing experts   : " + (
            "copied into the pool before use" if reads == "copy" or getattr(args, "prefetch_depth", 2) == 0 else
            "read by the MoE kernels straight from pinned host memory in decode steps of up to 16 tokens"
            + (" (where the GPU can map it; else copied in)" if reads == "auto" else "")))
    for hit in (0.5, 0.8, 0.95):
        lines.append(f"  at {hit:.0%} hit rate: {format_size(int(plan.bus_bytes_per_token(hit)))} per token over the bus")
    return lines


def load_notes(spec: ModelSpec, args: argparse.Namespace) -> tuple[str, ...]:
    """What a load with these flags would clamp on this model (the options checked as a load checks them)."""
    config = EngineConfig(model=model_dir(args), **engine_options(args))
    note = depth_note(config.prefetch_depth, spec)
    return fit_to_model(config, spec).notes + ((note,) if note else ())


def cmd_info(args: argparse.Namespace) -> int:
    spec = read_spec(model_dir(args))
    for note in load_notes(spec, args):
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(plan_lines(spec, args)))
    return 0
