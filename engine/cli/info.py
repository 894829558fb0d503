"""``info``: what a model is made of, what one token costs, and how it fits a GPU budget.

Needs only ``config.json`` (no weights; where the folder's tokenizer or weight files would stop a
load, a note says so, from their headers): expert bytes come from the expert layout the load would use
(MXFP4 as shipped for a checkpoint that says so in its ``quantization_config``, biases included), KV
bytes count sliding-window layers at their real size, as the KV cache allocates them
(:mod:`engine.kv.sizing`): a full-attention layer keeps every token of a sequence, a window layer of
window ``W`` at most ``W`` of them to attend to, in a fixed pool: ``ceil((W - 1) / block) + 2`` blocks
per sequence (its last ``W - 1`` keys, which may straddle one block more, and its next token's block)
and ``ceil(token_budget / block)`` for what one step's prefill chunks add, plus a scratch block:

    KV bytes = tokens of context x full_layers x per_layer_token
             + window_layers x per_layer_token x block_size
               x (max_batch x window_blocks_per_seq + window_step_blocks + 1)
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.checkpoint.converted import Manifest, is_converted
from engine.checkpoint.plan import (CATEGORIES, active_params_per_token, embedding_bytes, params_by_category,
                                    resident_bytes, resident_bytes_by_category)
from engine.checkpoint.spec import ModelSpec, read_spec
from engine.cli.options import engine_options, model_dir
from engine.config import DEFAULT_GROUP_SIZE, EngineConfig, format_size, parse_size
from engine.errors import ConfigError
from kernels.expert_layout import ExpertLayout
from engine.loading import expert_act
from engine.placement import auto_resident, fitting_group, resolve_device
from engine.kv.sizing import KVSizing, kv_sizing
from engine.memory import (CPU_KV_CAP, FOUR_BIT, MIN_KV_TOKENS, BudgetAdvice, MemoryPlan, default_budget, fit_context,
                           fit_context_on_host, fit_context_to_kv_size, kv_asked_bytes, kv_pool_bytes, plan_memory,
                           rope_table_bytes_per_token, smaller_resident, step_sizing, table_on_host)
from engine.options import parse_live, pool_bytes
from engine.settings_fit import asked_depth_note, fit_to_model, pool_size_note

if TYPE_CHECKING:
    from engine.parallel.stages import KVClaim

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BUSES = (("PCIe 4", 25.0), ("PCIe 5", 55.0))   # pinned host->device GB/s of an x16 card, for the bus-bound limit
HIT_RATES = (0.5, 0.8, 0.95)


def add_info_parser(sub, add_model_flag, add_engine_flags) -> None:
    p = sub.add_parser("info", help="parameters and bytes by category, and the GPU memory plan")
    add_model_flag(p)
    p.add_argument("--hit-rate", type=_hit_rate, default=None,
                   help="expert pool hit rate (0..1, or a percentage such as 80%%) to price the bus at, besides "
                        "50/80/95%% and the pool's share")
    add_engine_flags(p)


def expert_layout(spec: ModelSpec, fmt: str, group: int) -> ExpertLayout:
    """The layout a load would pack experts in (biases and activation as the family has them)."""
    return ExpertLayout.make(fmt, spec.hidden, spec.moe_ffn, group, bias=spec.family.expert_bias,
                             act=expert_act(spec))


def expert_bytes(spec: ModelSpec, fmt: str, group: int) -> int:
    return expert_layout(spec, fmt, group).nbytes


def _expert_format(spec: ModelSpec, args: argparse.Namespace, dtype: str) -> tuple[str, int]:
    """(format, group) of the experts as a load with these flags would hold them."""
    folder = Path(model_dir(args))
    if is_converted(folder):
        m = Manifest.read(folder)
        return m.weights, m.group_size
    if args.weight_format == "int4" and args.group_size == DEFAULT_GROUP_SIZE:
        return "int4", fitting_group(spec)[0]          # as a load picks it where 128 does not divide the widths
    if args.weight_format != "auto":
        return args.weight_format, args.group_size
    if spec.expert_storage in ("mxfp4", "fp8"):
        return spec.expert_storage, args.group_size
    return ("bf16" if _DTYPES[dtype].itemsize == 2 else "fp32"), args.group_size


def _resident_format(args: argparse.Namespace, spec: ModelSpec | None = None) -> str:
    """How a load with these flags keeps the resident matrices: bf16 (the dtype), fp8 or int8; for "auto"
    on a checkpoint that was not converted, as a load on this machine's GPU would (engine.loading.
    auto_resident: fp8 beside experts quantised at load, where the card's kernels take it); planned for
    a card that is not here, bf16."""
    chosen = getattr(args, "resident_weights", "auto")
    if chosen != "auto":
        return chosen
    folder = Path(model_dir(args))
    if is_converted(folder):
        return Manifest.read(folder).resident
    device = getattr(args, "device", "auto")
    if spec is None or device == "cpu" or not torch.cuda.is_available():
        return "bf16"
    dtype = _DTYPES[compute_dtype(args)]
    return auto_resident(args.weight_format, spec.expert_storage, resolve_device(device), dtype)[0]


def compute_dtype(args: argparse.Namespace) -> str:
    """The dtype a load with these flags computes in: ``--dtype``, else float32 where it runs on the
    CPU (``--device cpu``, or no CUDA GPU here and no ``--gpu-memory-budget`` to plan a card for) and
    bfloat16 on a GPU."""
    if args.dtype != "auto":
        return args.dtype
    device = getattr(args, "device", "auto")
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available()
                                 and getattr(args, "gpu_memory_budget", None) is None)
    return "float32" if on_cpu else "bfloat16"


def plan_lines(spec: ModelSpec, args: argparse.Namespace) -> list[str]:
    dtype = compute_dtype(args)
    wb = _DTYPES[dtype].itemsize
    fmt, group = _expert_format(spec, args, dtype)
    per_expert = expert_bytes(spec, fmt, group)
    n_experts = spec.num_moe_layers * spec.num_experts
    counts = params_by_category(spec)
    res_fmt = _resident_format(args, spec)
    by_cat = resident_bytes_by_category(spec, wb, res_fmt)
    lines = [f"model        {spec.name}  ({spec.architecture}, family {spec.family.name})",
             f"layers       {spec.num_layers} ({spec.num_moe_layers} MoE), {spec.num_experts} experts, top-{spec.top_k}, "
             f"hidden {spec.hidden}, expert FFN {spec.moe_ffn}",
             "", f"{'category':<16}{'parameters':>16}{'bytes':>14}"]
    resident = 0
    for cat in CATEGORIES:
        nbytes = n_experts * per_expert if cat == "routed_experts" else by_cat[cat]
        resident += 0 if cat == "routed_experts" else nbytes
        lines.append(f"{cat:<16}{counts[cat]:>16,}{format_size(nbytes):>14}")
    total_params = sum(counts.values())
    lines.append(f"{'total':<16}{total_params:>16,}{format_size(resident + n_experts * per_expert):>14}")
    active = active_params_per_token(spec)
    routed_active = spec.num_moe_layers * spec.top_k * per_expert
    active_bytes = resident_bytes(spec, wb, res_fmt, active=True) + routed_active
    lines += ["", f"active per token: {active:,} parameters, {format_size(active_bytes)} "
                  f"(routed experts {format_size(routed_active)} in {fmt}, {format_size(per_expert)} each; "
                  f"resident matrices in {res_fmt if res_fmt != 'bf16' else dtype})"]
    if dtype == "float32" and args.dtype == "auto":
        why = "--device cpu" if getattr(args, "device", "auto") == "cpu" else "no CUDA GPU here"
        lines.append(f"sizes in float32  : what a CPU run computes in ({why}); pass --gpu-memory-budget 24G or "
                     "--dtype bfloat16 for a GPU's sizes")
    c = EngineConfig(model=model_dir(args), **engine_options(args))
    context = min(c.max_model_len or spec.max_position, spec.max_position)
    kv = kv_sizing(spec, _DTYPES[dtype], c.kv_cache_dtype, context, c.max_batch, c.token_budget, c.kv_block_size)
    lines += _kv_lines(spec, kv, context)
    if c.pipeline_parallel > 1:
        return lines + _pipeline_lines(spec, args, c, per_expert, wb, res_fmt, context)
    if c.expert_parallel > 1:
        return lines + _expert_parallel_lines(spec, c, per_expert, resident, kv, context)
    lines += _budget_lines(spec, args, c, resident, per_expert, n_experts, wb, kv.bytes_per_token, kv.window_pool_bytes,
                           context, fmt)
    return lines


def _expert_parallel_lines(spec: ModelSpec, c: EngineConfig, per_expert: int, resident: int, kv: KVSizing,
                           context: int) -> list[str]:
    """Each card's share of the experts under ``--expert-parallel``, the pool its budget fits, and the
    context GPU 0's KV cache holds (the engine's rule, engine.loading)."""
    from engine.parallel.experts import ExpertShard, check_shards
    from engine.parallel.load import card_budgets
    n = c.expert_parallel
    check_shards(spec.num_experts, spec.top_k, n)
    budgets = card_budgets(c)
    lines = ["", f"expert parallel over {n} GPUs: every MoE layer's experts interleaved over the cards, each card "
                 "fetching its own misses over its own link; GPU 0 also holds everything else:"]
    fitted: list[str] = []
    for r, budget in enumerate(budgets):
        shard = ExpertShard(r, n, spec.num_experts)
        mine = spec.num_moe_layers * shard.local_experts
        res = resident if r == 0 else spec.num_moe_layers * shard.local_experts * spec.hidden * 2   # routers' rows
        text = (f"  GPU {r}: experts {r}, {r + n}, ... ({shard.local_experts} of {spec.num_experts} per layer, "
                f"{format_size(mine * per_expert)}), resident {format_size(res)}")
        if budget is not None:
            size = c.expert_pool_size        # bytes are the cards' total: each takes its experts' share
            size = int(size * shard.local_experts / spec.num_experts) if isinstance(size, int) else size
            plan = plan_memory(res, per_expert, mine, kv.bytes_per_token if r == 0 else 0, budget,
                               pool_bytes(size, mine * per_expert), experts_per_layer=shard.local_experts,
                               advice=BudgetAdvice(None, "", ""), window_kv_bytes=kv.window_pool_bytes if r == 0 else 0,
                               min_kv_tokens=0 if r else MIN_KV_TOKENS, **step_sizing(spec, c, 2),
                               kv_asked_bytes=None if r else kv_asked_bytes(c.kv_cache_size, kv.window_pool_bytes,
                                                                            kv.bytes_per_token, context, c.max_batch))
            text += (f"; budget {format_size(budget)}: pool {plan.pool_slots}/{mine} experts "
                     f"({plan.pool_slots / mine:.0%})")
            if r == 0 and not c.kv_cache_size:
                fitted = _context_line(*fit_context(context, c.max_model_len is not None,
                                                    kv_pool_bytes(plan, context, c.max_batch), kv.bytes_per_token,
                                                    c.kv_block_size, budget, "GPU 0"))
        lines.append(text)
    return lines + fitted


def _pipeline_lines(spec: ModelSpec, args: argparse.Namespace, c: EngineConfig, per_expert: int, wb: int,
                    res_fmt: str, context: int) -> list[str]:
    """The split over ``--pipeline-parallel`` GPUs and each card's own memory plan and bus traffic."""
    from engine.parallel.load import card_budgets, stage_configs
    from engine.parallel.plan import plan_pipeline
    from engine.parallel.stages import stage_claim, stage_spec
    budgets = card_budgets(c)
    if all(b is None for b in budgets) and torch.cuda.is_available():
        budgets = tuple(default_budget(torch.device(f"cuda:{i}")) if i < torch.cuda.device_count() else None
                        for i in range(c.pipeline_parallel))
    pp = plan_pipeline(spec, c.pipeline_parallel, wb, res_fmt, per_expert, budgets)
    lines = ["", f"pipeline over {pp.size} GPUs (one process each; layers balanced by the bytes each card holds):",
             *(f"  {line}" for line in pp.lines())]
    dtype = _DTYPES[compute_dtype(args)]
    kv_shares = [cfg.kv_cache_size for cfg in stage_configs(c, pp, torch.device("cpu"))]
    claims: list[KVClaim] = []
    cards: list[tuple[int, int, MemoryPlan]] = []      # (line to insert the plan before, rank, plan)
    for stage, budget in zip(pp.stages, budgets):
        if budget is None:
            lines.append(f"  GPU {stage.rank}: no budget given and no such CUDA GPU found; pass --gpu-memory-budget "
                         "24G (or one size per GPU: 24G,24G) to plan for the cards")
            continue
        sub = stage_spec(spec, stage)
        kv = kv_sizing(sub, dtype, c.kv_cache_dtype, context, c.max_batch, c.token_budget, c.kv_block_size)
        n = sub.num_moe_layers * sub.num_experts
        pool = pool_bytes(c.expert_pool_size, pp.expert_bytes)
        pool = None if pool is None else int(pool * pp.pool_fraction(stage.rank))
        plan = plan_memory(stage.resident_bytes, per_expert, n, kv.bytes_per_token, budget, pool,
                           experts_per_layer=sub.num_experts, active_experts_per_token=sub.num_moe_layers * sub.top_k,
                           advice=BudgetAdvice(None, "", ""), window_kv_bytes=kv.window_pool_bytes,
                           kv_asked_bytes=kv_asked_bytes(kv_shares[stage.rank], kv.window_pool_bytes,
                                                         kv.bytes_per_token, context, c.max_batch),
                           kv_share=pp.kv_fraction(stage.rank), **step_sizing(sub, c, wb))
        lines += ["", f"GPU {stage.rank} (layers {stage.layers}, budget {format_size(budget)}):"]
        cards.append((len(lines), stage.rank, plan))
        claims.append(stage_claim(plan, context, c.max_batch, c.kv_block_size, kv_shares[stage.rank]))
    blocks = None
    if len(claims) == pp.size:
        from engine.parallel.stages import NO_LIMIT, agree_kv
        agreed = agree_kv(claims, context, c.max_model_len is not None, c.kv_block_size)
        blocks = agreed.blocks
        lines += _kv_context_lines(c, context, claims)
    for at, rank, plan in reversed(cards):        # each card's KV cache as allocated: the blocks the cards agree
        kv = plan.kv_bytes if blocks is None or claims[rank].blocks == NO_LIMIT else \
            blocks * c.kv_block_size * plan.kv_bytes_per_token
        shown = plan if kv >= plan.kv_bytes else dataclasses.replace(plan, kv_bytes=kv)
        card = [f"  {line}" for line in shown.format()]
        if shown is not plan:
            i = next(i for i, line in enumerate(card) if line.startswith("  KV cache")) + 1
            card.insert(i, f"                      (the blocks every card keeps; the budget would leave it "
                           f"{format_size(plan.kv_bytes)})")
        lines[at:at] = card
    return lines


def _kv_context_lines(c: EngineConfig, context: int, claims: list[KVClaim]) -> list[str]:
    """The KV blocks every stage allocates and the context they hold, agreed as the engine's stages
    agree them (engine.parallel.stages.agree_kv): a context that does not fit the card with the least
    room is capped, or refused when set, naming that card."""
    from engine.parallel.stages import NO_LIMIT, agree_kv
    bs = c.kv_block_size
    agreed = agree_kv(claims, context, c.max_model_len is not None, bs)
    lines = ["", f"KV context        : every card keeps the same {agreed.blocks:,} blocks of {bs}, so the pipeline "
                 f"holds {agreed.blocks * bs:,} tokens of context (the fewest a card holding full-attention layers "
                 "allocates)"]
    free = [f"GPU {r}" for r, claim in enumerate(claims) if claim.blocks == NO_LIMIT]
    if free and len(free) < len(claims):
        lines.append(f"                    {' and '.join(free)} hold only sliding-window layers, which keep their "
                     "KV in the window pool: no limit on that number")
    return lines + _context_line(agreed.context, agreed.note)


def _context_line(context: int, note: str | None) -> list[str]:
    """The context the engine would load with, where a note says it is shorter than the model's."""
    return [f"context           : {context} tokens ({note.split(': ', 1)[1]})"] if note else []


def _kv_lines(spec: ModelSpec, kv: KVSizing, context: int) -> list[str]:
    """KV per token of context, window layers at their real size (formula in the module docstring)."""
    full = f"{kv.full_layers} full-attention layer{'s' if kv.full_layers != 1 else ''}"
    lines = ["", f"KV per token      : {format_size(kv.bytes_per_token)} in {full} "
                 f"({format_size(kv.layer_bytes_per_token)} per layer)"]
    if kv.window_layers:
        layers = f"{kv.window_layers} layer{'s' if kv.window_layers != 1 else ''}"
        lines.append(f"window layers     : {layers} of a {kv.window}-token window hold at most "
                     f"{kv.window} tokens of a sequence each, however long its context: "
                     f"{format_size(kv.window_bytes_per_seq)} per sequence ({kv.window_blocks_per_seq} blocks of "
                     f"{kv.block_size}), {format_size(kv.window_pool_bytes)} for {kv.max_batch} sequences and "
                     f"the {kv.window_step_blocks} blocks one step's prefill chunks add")
    elif any(spec.window(i) for i in range(spec.num_layers)):
        lines.append("window layers     : their window reaches the whole context, so they are counted as full layers")
    seq = kv.bytes_per_token * context + kv.window_bytes_per_seq
    lines.append(f"KV of one sequence: {format_size(seq)} at {context} tokens of context "
                 f"({format_size(seq // context)} per token)")
    return lines


def _budget_lines(spec, args, c: EngineConfig, resident: int, per_expert: int, n_experts: int, wb: int, kv_per_token: int,
                  window_kv: int, context: int, fmt: str) -> list[str]:
    """The engine's own memory plan for the budget given (or the card's free memory); ``window_kv``: the
    sliding-window layers' KV of a full batch, ``kv_per_token``: the full-attention layers'."""
    budget = parse_size(args.gpu_memory_budget, "gpu_memory_budget")
    on_gpu = torch.cuda.is_available() and getattr(args, "device", "auto") != "cpu"
    card_free = default_budget(torch.device("cuda")) if on_gpu else None
    budget = card_free if budget is None else budget
    if budget is None:            # a CPU run: the engine's rule for its KV cache (engine.loading)
        explicit, block = c.max_model_len is not None, c.kv_block_size
        held = (fit_context_to_kv_size(context, explicit, c.kv_cache_size, window_kv, kv_per_token, block)
                if c.kv_cache_size else fit_context_on_host(context, explicit, CPU_KV_CAP, window_kv, kv_per_token, block,
                                                            rope_table_bytes_per_token(spec, 4)))   # float32 on a CPU
        why = "a CPU run (--device cpu)" if getattr(args, "device", "auto") == "cpu" else "no CUDA GPU found"
        return ["", *_context_line(*held),
                f"GPU budget: none given and {why}; pass --gpu-memory-budget 24G to plan for a card"]
    total = per_expert * n_experts
    advice = BudgetAdvice(card_free if args.gpu_memory_budget is None else None,
                          "" if fmt in FOUR_BIT else "use --weight-format int4",
                          smaller_resident(wb == 4, _resident_format(args, spec)))
    def plan_for(table_on_host: bool) -> MemoryPlan:
        table = embedding_bytes(spec, wb) if table_on_host else 0
        return plan_memory(resident - table, per_expert, n_experts, kv_per_token, budget,
                           pool_bytes(parse_live("expert_pool_size", args.expert_pool_size), total),
                           experts_per_layer=spec.num_experts, active_experts_per_token=spec.num_moe_layers * spec.top_k,
                           advice=advice, window_kv_bytes=window_kv, host_resident_bytes=table,
                           kv_asked_bytes=kv_asked_bytes(c.kv_cache_size, window_kv, kv_per_token, context, c.max_batch),
                           **step_sizing(spec, c, wb))
    wanted = getattr(args, "embeddings", "auto")
    try:
        plan = plan_for(False)
    except ConfigError:
        if wanted == "device" or spec.tie_word_embeddings:
            raise
        plan = plan_for(True)     # as the engine loads: the table in host memory may be what makes it fit
    else:
        if table_on_host(wanted, spec.tie_word_embeddings, plan.pool_slots < plan.num_experts):
            plan = plan_for(True)
    # the KV cache the engine allocates: what the budget leaves (or --kv-cache-size), at most a full batch
    kv_alloc = kv_pool_bytes(plan, context, c.max_batch, c.kv_cache_size)
    shown = plan if kv_alloc == plan.kv_bytes else dataclasses.replace(plan, kv_bytes=kv_alloc)
    lines = ["", *shown.format()]
    if plan.note:
        at = next(i for i, line in enumerate(lines) if line.startswith("expert pool")) + 1
        lines.insert(at, f"                    ({plan.note})")
    if kv_alloc < plan.kv_bytes:
        at = next(i for i, line in enumerate(lines) if line.startswith("KV cache")) + 1
        lines.insert(at, f"                    (what a full batch fills, {c.max_batch} sequences of {context} tokens; "
                         f"the budget would leave it {format_size(plan.kv_bytes)})")
    # the engine's rule (engine.loading): one sequence's context fits the KV cache
    if c.kv_cache_size:
        lines += _context_line(*fit_context_to_kv_size(context, c.max_model_len is not None, c.kv_cache_size,
                                                       plan.window_kv_bytes, kv_per_token, c.kv_block_size))
    else:
        lines += _context_line(*fit_context(context, c.max_model_len is not None,
                                            kv_pool_bytes(plan, context, c.max_batch), kv_per_token, c.kv_block_size,
                                            budget))
    if plan.pool_slots < plan.num_experts:
        reads = getattr(args, "expert_reads", "auto")
        lines.append("missing experts   : " + (
            "copied into the pool before use" if reads == "copy" else
            "read by the MoE kernels straight from pinned host memory in decode steps of up to 16 tokens (one "
            "that several tokens of a step use: copied in once), else copied in"
            + (" (where the GPU can map it)" if reads == "auto" else "")))
    return lines + _bus_lines(plan, getattr(args, "hit_rate", None))


class _HitRate(float):
    """A hit rate that remembers how it was written, for a refusal to quote ("150%", not 1.5)."""

    text = ""


def _hit_rate(value: str) -> float:
    """``0.8`` or ``80%`` -> 0.8 (the range is checked with the plan)."""
    text = value.strip()
    try:
        rate = _HitRate(float(text[:-1]) / 100 if text.endswith("%") else float(text))
        rate.text = text
        return rate
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a hit rate; give a share from 0 to 1 or a percentage, "
                                         "e.g. 0.8 or 80%") from None


def _check_hit_rate(hit_rate: float | None) -> None:
    if hit_rate is not None and not 0.0 <= hit_rate <= 1.0:
        raise ConfigError(f"--hit-rate {getattr(hit_rate, 'text', '') or f'{hit_rate:g}'} is not a hit rate; give a share from 0 to 1 or a percentage, "
                          "e.g. 0.8 or 80%")


def _bus_lines(plan: MemoryPlan, hit_rate: float | None) -> list[str]:
    """Bus bytes per decoded token (one sequence) and the speed the bus alone allows, per hit rate."""
    _check_hit_rate(hit_rate)
    share = round(plan.pool_fraction, 4)
    tags = {r: "" for r in HIT_RATES} | {share: " (the pool's share: near-uniform routing)"}
    if hit_rate is not None:
        tags[hit_rate] = " (--hit-rate)"
    lines = ["bus per decoded token (one sequence) by expert hit rate, and the speed the bus alone allows:"]
    for rate in sorted(tags):
        bus = plan.bus_bytes_per_token(rate)
        limits = ", ".join(f"{gb * 1e9 / bus:.1f} tok/s on {name} ({gb:g} GB/s)" for name, gb in BUSES) if bus else \
            "no bus traffic"
        lines.append(f"  at {rate:.1%} hit rate{tags[rate]}: {format_size(int(bus))} per token over the bus; "
                     f"bus-bound at {limits}")
    return lines


def load_notes(spec: ModelSpec, args: argparse.Namespace) -> tuple[str, ...]:
    """What a load with these flags would clamp on this model (the options checked as a load checks them)."""
    config = EngineConfig(model=model_dir(args), **engine_options(args))
    note = asked_depth_note(config, spec)
    fmt, group = _expert_format(spec, args, compute_dtype(args))
    one = expert_bytes(spec, fmt, group)
    pool = pool_size_note(config.expert_pool_size, spec.num_moe_layers * spec.num_experts * one, one)
    groups = fitting_group(spec)[1] if fmt == "int4" and args.group_size == DEFAULT_GROUP_SIZE \
        and not is_converted(Path(model_dir(args))) else ()           # as a load says it
    return fit_to_model(config, spec).notes + groups + tuple(n for n in (note, pool) if n)


def cmd_info(args: argparse.Namespace) -> int:
    _check_hit_rate(getattr(args, "hit_rate", None))          # with or without a budget to price it at
    folder = model_dir(args)
    spec = read_spec(folder)
    for note in load_notes(spec, args):
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(plan_lines(spec, args)))
    from engine.loading import load_problem
    problem = load_problem(Path(folder), spec)
    if problem is not None:              # the plan stands on config.json; a load would stop here
        print(f"note: the plan above is from config.json alone; loading this folder would fail: {problem}",
              file=sys.stderr)
    return 0
