"""Builds a ready-to-run engine core from an EngineConfig: spec, tokenizer, weights, experts, KV cache."""
from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.checkpoint.fp8_blocks import with_fp8_blocks
from engine.checkpoint.converted import ConvertedSource, convert_command, is_converted
from engine.checkpoint.integrity import Progress
from engine.checkpoint.loader import check_complete, load_weights
from engine.checkpoint.plan import embedding_bytes, params_by_category, resident_bytes
from engine.checkpoint.reader import SafetensorsReader, TensorSource, with_aliases
from engine.checkpoint.spec import ModelSpec, read_spec
from engine.config import DEFAULT_GROUP_SIZE, DIRECT_READS, EngineConfig
from engine.options import PoolShare, PoolSize, parse_live, pool_bytes
from engine.errors import ConfigError, StrataError
from engine.experts.provider import ExpertProvider
from engine.experts.profile import check_record_target, read_routing_profile, write_routing_profile
from engine.cpu_threads import apply_cpu_threads
from engine.kv.blocks import BlockAllocator
from engine.memory import (CPU_KV_CAP, FOUR_BIT, HOST_ROOM_SHARE, BudgetAdvice, MemoryPlan, available_host_bytes,
                           check_host_room, decode_experts, default_budget, fit_context, fit_context_on_host,
                           fit_context_to_kv_size, kv_asked_bytes, kv_pool_bytes, kv_size_note, plan_memory,
                           rope_table_bytes_per_token, prefer_expandable_segments, staging_slots, smaller_resident, step_sizing, table_on_host)
from engine.settings_fit import fit_to_device, fit_to_model, fit_to_pool, pool_size_note, unused_notes
from engine.kv.cache import KVCache
from engine.kv.sizing import KVSizing, kv_sizing
from kernels.host_rows import host_rows_readable
from engine.kv.windows import WindowBlocks
from engine.models.moe_transformer import ForwardBatch, MoETransformer
from engine.cuda_graphs import DecodeGraphs
from engine.runner import ModelRunner, SeqPart, build_batch
from engine.scheduler import Scheduler
from engine.tokenizer import Tokenizer
from engine.placement import auto_resident, expert_act, expert_layout, fitting_group, resolve_device, resolve_dtype

__all__ = ["CPU_KV_CAP", "LoadedModel", "ModelInfo", "check_paths", "expert_act", "expert_layout", "load_model",
           "resolve_device", "resolve_dtype"]

if TYPE_CHECKING:
    from engine.parallel.experts import ExpertShard
    from engine.parallel.stages import StageContext


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    architecture: str
    path: str
    num_layers: int
    num_moe_layers: int
    num_experts: int
    top_k: int
    params: int
    expert_format: str
    expert_bytes: int              # one routed expert, packed
    routed_expert_bytes: int       # every routed expert of every MoE layer
    is_demo: bool
    random_weights: bool
    completion_only: bool = False  # a base model: its chat template (if any) is not what it was trained on
    resident_format: str = "bf16"  # attention, dense MLPs and LM head on the device: bf16 (the dtype), fp8, int8
    notes: tuple[str, ...] = ()    # one line each: a setting clamped or ignored at load, and why


def _demo_marker(path: Path) -> dict:
    f = path / "STRATA_DEMO.json"
    try:
        return json.loads(f.read_text()) if f.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


class LoadedModel:
    """Everything the engine runs on, built once per model load."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, source: TensorSource, tokenizer: Tokenizer | None,
                 path: Path | None = None, notes: tuple[str, ...] = (), stage: "StageContext | None" = None,
                 shard: "ExpertShard | None" = None) -> None:
        """``stage``: this model is one stage of a pipeline (engine/parallel), ``spec`` its slice.
        ``shard``: card 0 of expert parallel, which holds only its own share of every layer's experts."""
        t0 = time.perf_counter()
        self.config, self.spec, self.tokenizer = config, spec, tokenizer
        self.stage, self.shard = stage, shard
        self.full_spec = stage.full_spec if stage is not None else spec     # the whole model, as reported
        self.pipeline = None          # the first stage of a pipeline: the other stages (engine/parallel/pipeline.py)
        self.device = resolve_device(config.device)
        if self.device.type == "cuda":
            prefer_expandable_segments()
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.converted = isinstance(source, ConvertedSource) or getattr(source, "manifest", None) is not None
        # how attention, dense MLPs and the LM head sit on the device: bf16 (the dtype), fp8 or int8
        self.resident_format, note = ((config.resident_weights, None) if config.resident_weights != "auto" else
                                      (source.manifest.resident, None) if self.converted else
                                      auto_resident(config.weight_format, spec.expert_storage, self.device, self.dtype))
        source = with_aliases(with_fp8_blocks(source, spec), spec.family.aliases)
        check_complete(spec, source)
        chosen: tuple[str, ...] = ()
        if config.weight_format == "int4" and config.group_size == DEFAULT_GROUP_SIZE and not self.converted:
            group, chosen = fitting_group(spec)     # as convert picks it, where 128 does not divide the widths
            config = config.replace(group_size=group)
        self.layout = expert_layout(config, spec, self.dtype)
        self.config = config = self._fit(config)
        self.notes += chosen + unused_notes(config, self.layout.fmt) + ((note,) if note else ())
        self.max_model_len = config.max_model_len or spec.max_position
        self.kv_blocks: int | None = None     # a pipeline stage's full-attention blocks, as the stages agreed
        self._host_kv_cap: int | None = None  # a CPU run's default KV cache: at most what the host has free
        self.embed_on_host = False
        try:
            self.plan = self._plan()  # fails fast, before any allocation, when the model cannot fit
        except ConfigError:
            if not self._table_may_leave() or not host_rows_readable(_pinned_probe(), self.device):
                raise                         # (a table the kernels cannot read from host memory stays put)
            self.embed_on_host = True     # it may fit with the table in host memory (else that plan's error)
            self.plan = self._plan()
        if not self.embed_on_host and self._embedding_to_host():
            self.embed_on_host = True
            self.plan = self._plan()  # the pool (or the KV cache) takes the table's room
        pool = fit_to_pool(config, spec, self.experts_resident)
        self.config = config = pool.config
        self.notes += pool.notes + notes
        note = pool_size_note(self.pool_bytes(config.expert_pool_size), self.every_expert_bytes, self.layout.nbytes)
        self.notes += (note,) if note else ()
        self._fit_context()
        if self.device.type == "cpu" and self.stage is None:
            self._check_host_room()
        if isinstance(config.expert_pool_size, PoolShare):    # "50%" -> bytes, so the config reads plainly
            self.config = config = config.replace(expert_pool_size=self.pool_bytes(config.expert_pool_size))
        self.weights, rows = load_weights(spec, source, self.device, self.dtype, self.layout, self._allocate_rows,
                                          self.resident_format, self.embed_on_host)
        if self.embed_on_host and not host_rows_readable(self.weights.embed, self.device):
            self.weights.embed = self.weights.embed.to(self.device)
            self.weights.embed_on_host = self.embed_on_host = False
            self.plan = self._plan()      # the table is the card's again: the pool gives its room back
            self.notes += ("the embedding table is on the GPU: its kernels cannot read host memory here",)
        self.notes += (self.plan.note,) if self.plan.note else ()
        self.experts: ExpertProvider = self._build_experts(rows)
        self.model = MoETransformer(spec, self.weights, self.experts, self.device, self.dtype, self.max_model_len)
        z = self.kv_sizing
        # sliding-window layers' blocks, freed as they fall out of reach (None: one pool for every layer)
        zw = self._sizing(self.full_spec)    # the whole model's: a pipeline's stages share the block tables
        self.windows = WindowBlocks(zw.window, config.max_batch, config.token_budget, z.block_size) if zw.windowed \
            else None
        self.cache = self._build_cache()
        # the last block is scratch space for the padding rows of graph-captured decode batches
        self.allocator = BlockAllocator(self.cache.num_blocks - 1, self.cache.block_size)
        self.scheduler = Scheduler(self.allocator, config.max_batch, config.token_budget, config.prefill_chunk,
                                   self.windows)
        self.runner = ModelRunner(self.model, self.cache, self.make_graphs() if config.cuda_graphs else None)
        marker = _demo_marker(path) if path else {}
        full = self.full_spec
        self.info = ModelInfo(
            name=spec.name or "model", family=spec.family.name, architecture=spec.architecture,
            path=str(path or ""), num_layers=full.num_layers, num_moe_layers=full.num_moe_layers,
            num_experts=spec.num_experts, top_k=spec.top_k, params=sum(params_by_category(full).values()),
            expert_format=self.layout.fmt, expert_bytes=self.layout.nbytes,
            routed_expert_bytes=self.layout.nbytes * full.num_moe_layers * spec.num_experts,
            is_demo=bool(marker.get("demo")),
            random_weights=bool(marker.get("random_weights")), completion_only=bool(marker.get("completion_only")),
            resident_format=self.resident_format, notes=self.notes)
        if self.device.type == "cuda":       # the load's temporaries (16-bit weights quantised on the card) go
            torch.cuda.empty_cache()         # back to the driver: the card shows what the model holds
        self.load_seconds = time.perf_counter() - t0

    def _fit_context(self) -> None:
        """On a GPU budget, a context no longer than the KV cache the plan leaves holds for one sequence
        (the cache holds at least one sequence at full context, so a longer one would go past the budget);
        a KV size given outright keeps it. The stages of several GPUs agree on their blocks, and so on
        the context, by the same rule applied to the card with the least room (stages.agree_kv)."""
        c = self.config
        if self.stage is not None:
            from engine.parallel.stages import agree_kv, stage_claim
            claim = stage_claim(self.plan, self.max_model_len, c.max_batch, c.kv_block_size, c.kv_cache_size)
            agreed = agree_kv(self.stage.share_claims(claim), self.max_model_len, c.max_model_len is not None,
                              c.kv_block_size)
            self.max_model_len, self.kv_blocks = agreed.context, agreed.blocks
            self.notes += (agreed.note,) if agreed.note else ()
            return
        if c.kv_cache_size:
            self.max_model_len, note = fit_context_to_kv_size(
                self.max_model_len, c.max_model_len is not None, c.kv_cache_size, self.plan.window_kv_bytes,
                self._kv_bytes_per_token(), c.kv_block_size)
            more = kv_size_note(c.kv_cache_size, self.plan.window_kv_bytes, self._kv_bytes_per_token(),
                                self.max_model_len, c.max_batch)
            self.notes += tuple(n for n in (note, more) if n)
            return
        if self.plan.budget_bytes is None:      # the CPU: no budget, a KV cache of CPU_KV_CAP
            elem = torch.empty((), dtype=self.dtype).element_size()
            self.max_model_len, note = fit_context_on_host(
                self.max_model_len, c.max_model_len is not None, CPU_KV_CAP, self.plan.window_kv_bytes,
                self._kv_bytes_per_token(), c.kv_block_size, rope_table_bytes_per_token(self.spec, elem))
            self.notes += (note,) if note else ()
            return
        card = "GPU 0" if self.shard is not None else ""      # expert parallel: the KV cache is on the first card
        self.max_model_len, note = fit_context(self.max_model_len, c.max_model_len is not None, self._kv_cache_bytes(),
                                               self._kv_bytes_per_token(), c.kv_block_size, self.plan.budget_bytes, card)
        self.notes += (note,) if note else ()

    def _check_host_room(self) -> None:
        """The KV cache and RoPE tables of a CPU run against the host memory free now (one line if too big)."""
        s, c = self.spec, self.config
        bpt, available = self._kv_bytes_per_token(), available_host_bytes()
        if available is not None:        # the weights, loaded next, take their share of it first
            available -= self.plan.resident_bytes + self.plan.host_bytes
            if available <= 0:
                return                   # the weights alone: nothing a context setting could fix
        table = rope_table_bytes_per_token(s, torch.empty((), dtype=self.dtype).element_size())
        if not c.kv_cache_size and available is not None:     # the default cache: no more than the host has free
            self._host_kv_cap = max(0, int(available * HOST_ROOM_SHARE) - self.max_model_len * table
                                    - self.plan.window_kv_bytes)
        full = max(self._kv_cache_bytes(), self.max_model_len * bpt)        # what _build_cache allocates
        check_host_room(self.max_model_len, full, self.plan.window_kv_bytes, bpt, table, c.kv_block_size,
                        c.kv_cache_size, available, " beside the model's weights")

    def _embedding_to_host(self) -> bool:
        """Whether the embedding table goes to host memory (``config.embeddings``; auto: on a CUDA GPU
        when the pool holds fewer than all experts). Notes a "host" that cannot be honoured."""
        want = self.config.embeddings
        if want == "device" or self.device.type != "cuda":
            return False                  # on the CPU the table is in host memory already
        if self.spec.tie_word_embeddings or self.stage is not None or self.shard is not None:
            if want == "host":
                why = ("it is the LM head's too, which reads all of it" if self.spec.tie_word_embeddings
                       else "the stages of several GPUs keep it on their card")
                self.notes += (f"embeddings=host is ignored: the embedding table stays on the GPU ({why})",)
            return False
        return table_on_host(want, False, self.plan.pool_slots < self.plan.num_experts)

    def _table_may_leave(self) -> bool:
        """Whether this load could hold the embedding table in host memory: on a CUDA GPU, not told to keep it
        on the card, not tied to the LM head, one card."""
        return (self.config.embeddings != "device" and self.device.type == "cuda" and not self.spec.tie_word_embeddings
                and self.stage is None and self.shard is None)

    def _fit(self, config: EngineConfig) -> EngineConfig:
        """Settings fitted to the model and the device (``self.notes`` says what changed); on the CPU,
        the math threads chosen by the bytes a token reads."""
        model, device = fit_to_model(config, self.spec), fit_to_device(config, self.device)
        self.notes: tuple[str, ...] = model.notes + device.notes
        self.cpu_threads: int | None = None        # set on the CPU only
        config = device.config.replace(max_model_len=model.config.max_model_len)
        if self.device.type == "cpu":
            self.cpu_threads, note = apply_cpu_threads(config.cpu_threads, self.active_bytes_per_token())
            self.notes += (note,) if note else ()
        return config

    def active_bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: the resident weights it uses and k experts per MoE layer."""
        s = self.spec
        elem = torch.empty((), dtype=self.dtype).element_size()
        dense = resident_bytes(s, elem, self.resident_format, active=True)
        return dense + s.num_moe_layers * s.top_k * self.layout.nbytes

    @property
    def experts_resident(self) -> bool:
        """Every expert on the device, no pool to manage: no pool size asked for and all of them fit."""
        return self.config.expert_pool_size is None and self.plan.pool_slots >= self.plan.num_experts

    def _allocate_rows(self, rows: int, nbytes: int) -> torch.Tensor:
        from engine.experts.store import host_rows
        return host_rows(rows, nbytes)

    @property
    def graphs_possible(self) -> str | None:
        """None when decode steps can be graph-captured, else why not."""
        if self.device.type != "cuda":
            return "CUDA graphs need a CUDA GPU"
        if self.stage is not None:
            return "the stages of a pipeline run their decode steps eagerly"
        if self.shard is not None:
            return "expert parallel runs its decode steps eagerly"
        return None

    def make_graphs(self) -> DecodeGraphs | None:
        if self.graphs_possible is not None:
            return None
        bs = self.cache.block_size
        return DecodeGraphs(self.model, self.cache, self.config.max_batch, -(-self.max_model_len // bs),
                            self.cache.num_blocks - 1, self.windows.placeholder if self.windows else None)

    def _plan(self) -> MemoryPlan:
        s, c = self.spec, self.config
        elem = torch.empty((), dtype=self.dtype).element_size()
        resident = resident_bytes(s, elem, self.resident_format, embed_on_host=self.embed_on_host)
        budget = c.gpu_memory_budget if c.gpu_memory_budget is not None else default_budget(self.device)
        if self.device.type != "cuda":
            budget = None     # no device memory to budget on the CPU
        per_layer = self.local_experts
        return plan_memory(resident, self.layout.nbytes, s.num_moe_layers * per_layer, self._kv_bytes_per_token(),
                           budget, self.pool_bytes(c.expert_pool_size), experts_per_layer=per_layer,
                           active_experts_per_token=s.num_moe_layers * s.top_k, advice=self._budget_advice(),
                           window_kv_bytes=self.kv_sizing.window_pool_bytes,
                           host_resident_bytes=embedding_bytes(s, elem) if self.embed_on_host else 0,
                           # a pipeline stage's config holds its share of the size (engine.parallel.load)
                           kv_asked_bytes=kv_asked_bytes(c.kv_cache_size, self.kv_sizing.window_pool_bytes,
                                                         self._kv_bytes_per_token(), self.max_model_len, c.max_batch),
                           kv_share=self.stage.plan.kv_fraction(self.stage.rank) if self.stage is not None else 1.0,
                           **step_sizing(s, c, elem, gpu=self.device.type == "cuda"))

    def _budget_advice(self) -> BudgetAdvice:
        """The fixes open to this load when the plan does not fit the budget."""
        if self.layout.fmt in FOUR_BIT:         # int4 would not be smaller (mxfp4's experts are 4.25 bits)
            experts = ""
        elif self.converted:
            experts = "convert the source model with --weights int4"
        else:
            experts = "use --weight-format int4"
        return BudgetAdvice(default_budget(self.device), experts,
                            smaller_resident(self.dtype == torch.float32, self.resident_format))

    def _pool_budget(self) -> int | None:
        """Bytes the expert pool (with staging) may grow to: the budget less everything else."""
        return self.plan.pool_room(self._kv_cache_bytes())

    def pool_bytes(self, size: PoolSize) -> int | None:
        """Pool bytes of a parsed pool size: a share ("50%") of all routed experts resolved against their bytes.

        A pipeline stage takes a size in bytes as the pool of the whole pipeline and keeps its own
        share of it (its routed experts' share of the model's)."""
        if isinstance(size, int) and self.stage is not None:
            size = int(size * self.stage.plan.pool_fraction(self.stage.rank))
        if isinstance(size, int) and self.shard is not None:
            size = int(size * self.local_experts / self.spec.num_experts)
        return pool_bytes(size, self.every_expert_bytes)

    @property
    def every_expert_bytes(self) -> int:
        """Bytes of every routed expert this model's pool and host store hold."""
        return self.layout.nbytes * self.spec.num_moe_layers * self.local_experts

    @property
    def local_experts(self) -> int:
        """Experts per MoE layer this model's pool and host store hold (all, or an expert shard's share)."""
        return self.shard.local_experts if self.shard is not None else self.spec.num_experts

    def pool_request(self, value: object) -> int | None:
        """Pool bytes of a pool size as given (bytes, "10G", "50%" or None), checked by ``parse_live``."""
        return self.pool_bytes(parse_live("expert_pool_size", value))

    @property
    def kv_sizing(self) -> KVSizing:
        """The KV cache's split between the full-attention pool and the sliding-window layers' pool."""
        return self._sizing(self.spec)

    def _sizing(self, spec: ModelSpec) -> KVSizing:
        c = self.config
        return kv_sizing(spec, self.dtype, c.kv_cache_dtype, self.max_model_len, c.max_batch, c.token_budget,
                         c.kv_block_size)

    def _kv_bytes_per_token(self) -> int:
        """KV bytes each token of context adds (the full-attention layers')."""
        return self.kv_sizing.bytes_per_token

    def _build_experts(self, rows: torch.Tensor) -> ExpertProvider:
        from engine.experts.manager import ExpertManager
        plan, c = self.plan, self.config
        # Prediction routers: each MoE layer routes rms_norm(x) * post_norm; folding its norm weight into the
        # router leaves only a positive per-token scale, which top-k ignores, so the predictor can apply it
        # to the raw residual stream of an earlier layer.
        # A router bias (gpt-oss) breaks that scale-freedom: predictions add it scaled by the token's RMS.
        moe = [layer for layer in self.weights.layers if layer.moe is not None]
        routers = [layer.moe.router * layer.post_norm for layer in moe]
        bias = [layer.moe.router_bias for layer in moe] if self.spec.family.router_bias else None
        choice = [layer.moe.score_bias for layer in moe] if self.spec.family.score_bias else None   # GLM
        top_k, per_layer = self.spec.top_k, self.local_experts
        if self.shard is not None:             # only this card's experts: their rows, router rows and biases
            from engine.parallel.experts import shard_rows
            own = self.shard.experts
            rows = shard_rows(rows, self.spec.num_experts, own)
            routers = [r[own] for r in routers]
            bias = [b[own] for b in bias] if bias is not None else None
            choice = [c[own] for c in choice] if choice is not None else None
            top_k = min(top_k, per_layer)
        options = dict(routing_profile=c.routing_profile, budget_bytes=self._pool_budget(),
                       direct_reads=DIRECT_READS[c.expert_reads], top_k=top_k, router_bias=bias,
                       norm_eps=self.spec.rms_norm_eps, cold_experts=c.cold_experts, score_bias=choice,
                       staging_slots=self.plan.staging_slots or staging_slots(per_layer, decode_experts(self.spec, c)))
        route = self._route if self.shard is None else self._shard_route(top_k)
        if self.experts_resident:      # a full pool over the experts' device buffer; the knobs stay live
            return ExpertManager.resident(self.layout, rows.to(self.device), per_layer,
                                          c.prefetch_depth, c.expert_policy, routers, route, **options)
        return ExpertManager.from_rows(self.layout, rows, per_layer, self.device,
                                       plan.pool_slots * plan.expert_bytes, c.prefetch_depth, c.expert_policy,
                                       routers, route, **options)

    def _route(self, logits: torch.Tensor):
        return self.model.route(logits)

    def _shard_route(self, top_k: int):
        """The predictions' routing over an expert shard's own experts (its top ``top_k`` of them)."""
        from engine.models.moe_transformer import route_ref
        return lambda logits: route_ref(logits, top_k, self.spec.renormalize)

    def _kv_cache_bytes(self) -> int:
        """Bytes of the full-attention pool (engine.memory.kv_pool_bytes)."""
        c = self.config
        pool = kv_pool_bytes(self.plan, self.max_model_len, c.max_batch, c.kv_cache_size)
        return pool if self._host_kv_cap is None else min(pool, self._host_kv_cap)

    def _build_cache(self) -> KVCache:
        s, c = self.spec, self.config
        if self.stage is not None:          # every stage holds the same blocks: the scheduler's tables span them all
            blocks = self.kv_blocks
        else:
            bpt = max(1, self._kv_bytes_per_token())           # 0 when every layer is a window layer
            blocks = max(self._kv_cache_bytes() // (bpt * c.kv_block_size), -(-self.max_model_len // c.kv_block_size))
        window = self.windows.num_blocks if self.windows else 0
        return KVCache(s.num_layers, int(blocks) + 1, c.kv_block_size, s.kv_heads_stored, s.kv_head_dim_stored, self.dtype,
                       self.device, c.kv_cache_dtype,   # + 1: the scratch block of graph-captured decode batches
                       window_layers=self.kv_sizing.windowed, window_blocks=window, v_head_dim=s.kv_v_dim_stored)

    def score(self, seqs: list[list[int]], chunk: int | None = None) -> list[torch.Tensor]:
        """Logits [T_i, V] for every position of each sequence, on KV blocks of their own.

        All sequences go through one batched forward per chunk of ``chunk`` tokens (prefill_chunk).
        """
        need = sum(self.allocator.blocks_needed(len(ids), 0) for ids in seqs)
        if not self.allocator.can_allocate(need):
            raise ConfigError(f"scoring needs {need} free KV blocks but {self.allocator.num_free} are free; "
                              "wait for running requests or raise --kv-cache-size")
        chunk = chunk or self.config.prefill_chunk
        w = self.windows
        if w is not None and not w.allocator.can_allocate(len(seqs) * w.blocks_for(chunk)):
            raise ConfigError(f"scoring needs {len(seqs) * w.blocks_for(chunk)} free sliding-window KV blocks but "
                              f"{w.allocator.num_free} are free; wait for running requests or lower --prefill-chunk")
        tables = [self.allocator.allocate(self.allocator.blocks_needed(len(ids), 0)) for ids in seqs]
        windows: list[list[int]] = [[] for _ in seqs]
        outs: list[list[torch.Tensor]] = [[] for _ in seqs]
        try:
            for start in range(0, max(len(ids) for ids in seqs), chunk):
                live = [i for i, ids in enumerate(seqs) if len(ids) > start]
                for i in live if w is not None else ():
                    w.advance(windows[i], start, min(len(seqs[i]), start + chunk))
                batch = self._score_batch([seqs[i] for i in live], [tables[i] for i in live],
                                          [windows[i] for i in live], start, chunk)
                logits = self.model.forward(batch, self.cache).cpu()
                for i, s in zip(live, batch.seqs):
                    outs[i].append(logits[s.q_start:s.q_start + s.q_len])
            return [torch.cat(o, 0) for o in outs]
        finally:
            for t, wt in zip(tables, windows):
                self.allocator.free(t)
                if w is not None:
                    w.free(wt)

    def _score_batch(self, seqs: list[list[int]], tables: list[list[int]], windows: list[list[int]], start: int,
                     chunk: int) -> ForwardBatch:
        """One chunk of scoring: tokens ``start .. start + chunk`` of each sequence, logits of every one."""
        parts = [SeqPart(seq[start:start + chunk], start, table, window)
                 for seq, table, window in zip(seqs, tables, windows)]
        return build_batch(parts, self.cache.block_size, self.device, self.windows is not None, every_row=True)

    def release(self) -> None:
        """Drop every reference to the model's tensors (after :meth:`close`): this object keeps its
        description (config, spec, info, plan), not its weights, cache, pool or recorded steps."""
        for name in ("model", "weights", "cache", "runner", "scheduler", "allocator", "windows", "experts"):
            if hasattr(self, name):
                setattr(self, name, None)

    def close(self) -> None:
        try:
            if self.config.record_routing:
                self.experts.settle()
                write_routing_profile(self.config.record_routing, self.experts.stats().activations)
        finally:
            try:
                self.experts.close()
            finally:
                if self.pipeline is not None:
                    self.pipeline.close()


def _pinned_probe() -> torch.Tensor:
    """A small page-locked table, as the embedding table in host memory is, to ask the GPU's kernels
    whether they read such memory before a plan counts on it."""
    return torch.arange(64, dtype=torch.float16).reshape(4, 16).pin_memory()


def check_paths(config: EngineConfig, spec: ModelSpec) -> None:
    """The routing profile to read fits the model; the one to record has a writable place."""
    if config.record_routing:
        check_record_target(config.record_routing)
    if config.routing_profile:
        read_routing_profile(config.routing_profile, spec.num_moe_layers, spec.num_experts)


def load_problem(path: Path, spec: ModelSpec) -> str | None:
    """Why a load of the folder at ``path`` would fail before it allocated anything (its tokenizer, its
    weight files' names, shapes and dtypes against ``spec``), in the load's own words; None when it
    would get that far. Reads the files' headers, not their tensors."""
    try:
        Tokenizer.from_dir(path)
        source = ConvertedSource(path, verify=False) if is_converted(path) else SafetensorsReader(path)
        check_complete(spec, with_aliases(with_fp8_blocks(source, spec), spec.family.aliases))
    except StrataError as e:
        return str(e)
    return None


def load_model(config: EngineConfig, progress: Progress | None = None) -> LoadedModel:
    """Read the model folder named by ``config.model`` (one-line errors for every way it can be wrong).

    ``progress(done, total, label)`` follows the checksum check of a converted folder's first load.
    """
    path = Path(config.model)
    spec = read_spec(path)
    check_paths(config, spec)     # a bad profile path fails now, before the weights are read, not at exit
    tokenizer = Tokenizer.from_dir(path)
    template = ((f"{tokenizer.template_problem}; until then chat is refused and plain prompts work",)
                if tokenizer.template_problem else ())
    if is_converted(path):
        source = ConvertedSource(path, verify=config.verify, progress=progress)
        fmt = source.manifest.weights
        if config.weight_format not in ("auto", fmt):
            raise ConfigError(f"{path} holds {fmt} experts, converted by {convert_command()}; drop --weight-format "
                              f"or convert the source again with --weights {config.weight_format}")
        group = source.manifest.group_size
        notes = template + _checksum_notes(path, source)
        if fmt == "int4" and config.group_size not in (group, DEFAULT_GROUP_SIZE):
            notes += (f"group size {config.group_size} is ignored: {path} was converted with int4 groups of {group}; "
                      f"convert again with --group-size {config.group_size} for other groups",)
        config = config.replace(weight_format=fmt, group_size=group if fmt == "int4" else config.group_size)
        if config.pipeline_parallel > 1 or config.expert_parallel > 1:
            return _pipelined(config, spec, source, tokenizer, path, notes)
        loaded = LoadedModel(config, spec, source, tokenizer, path, notes)
        source.manifest.check_layout(loaded.layout, path)
        return loaded
    notes = template + (((f"verify checks the checksums of a folder written by {convert_command()}; this is a "
                          "Hugging Face folder, which has none, so it was ignored"),) if config.verify else ())
    if config.pipeline_parallel > 1 or config.expert_parallel > 1:
        return _pipelined(config, spec, SafetensorsReader(path), tokenizer, path, notes)
    return LoadedModel(config, spec, SafetensorsReader(path), tokenizer, path, notes)


def _pipelined(config: EngineConfig, spec: ModelSpec, source: TensorSource, tokenizer: Tokenizer | None, path: Path,
               notes: tuple[str, ...]) -> LoadedModel:
    from engine.parallel.load import load_expert_parallel, load_pipeline
    load = load_pipeline if config.pipeline_parallel > 1 else load_expert_parallel
    return load(config, spec, source, tokenizer, path, notes, LoadedModel)


def _checksum_notes(path: Path, source: ConvertedSource) -> tuple[str, ...]:
    """Why the good checksums could not be remembered in ``path``, and the fix for that cause."""
    report = source.checksums
    if report.saved:
        return ()
    lost = "so the good checksums were not remembered and every load checks them again"
    if report.save_errno == errno.ENOSPC:
        return (f"the disk holding {path} is full, {lost}; free space on it to load it faster",)
    if report.save_errno == errno.EDQUOT:
        return (f"your disk quota for {path} is used up, {lost}; free space within it to load it faster",)
    if report.save_errno == errno.EROFS:
        return (f"{path} is on a read-only filesystem, {lost}; remount it read-write to load it faster",)
    return (f"{path} cannot be written, {lost}; make the folder writable to load it faster",)
