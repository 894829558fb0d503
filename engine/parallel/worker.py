"""What the process of a pipeline stage past the first runs (started by engine/parallel/pipeline.py).

It loads its stage, then serves its pipe: a step's batch description (build the batch on its own
device, receive the activations from the stage before, run its layers, send them on), live options,
stats requests, and close. It ignores Ctrl-C (the engine's process shuts the stages down) and ends
itself when that process is gone, whether its pipe closes or its parent changes.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from engine.errors import StrataError


def _watch_parent(parent: int) -> None:
    """End this process when the engine's process is gone (no orphan survives a killed engine)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.2)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _load(config, path: str, plan, rank: int, conn):
    from engine.checkpoint.converted import ConvertedSource, is_converted
    from engine.checkpoint.reader import SafetensorsReader
    from engine.checkpoint.spec import read_spec
    from engine.errors import PipelineError
    from engine.loading import LoadedModel
    from engine.parallel.stages import StageContext, StageSource, stage_spec

    def share(claim):
        """The first stage hands every stage's KV claim back (engine/parallel/pipeline.py share_claims)."""
        conn.send(("kv_claim", claim))
        msg = conn.recv()
        if msg[0] != "kv_claims":
            raise PipelineError(f"the engine's process sent {msg[0]!r} while the stages agreed on their KV blocks")
        return msg[1]

    folder = Path(path)
    spec = read_spec(folder)
    # a converted folder's checksums were checked by the first stage before this process started
    source = ConvertedSource(folder, verify=False) if is_converted(folder) else SafetensorsReader(folder)
    stage = plan.stages[rank]
    return LoadedModel(config, stage_spec(spec, stage), StageSource(source, stage), None, folder, (),
                       stage=StageContext(spec, plan, rank, share))


def _stats(m, rank: int):
    from engine.stats import memory_of
    from engine.telemetry import StageStats
    m.experts.settle()
    if isinstance(m, ShardModel):
        return StageStats(rank, str(m.device), 0, m.spec.num_layers, m.experts.stats(), m.memory(),
                          m.experts.host_syncs)
    s = m.stage.stage
    return StageStats(rank, str(m.device), s.start, s.end, m.experts.stats(), memory_of(m), m.experts.host_syncs)


class ShardModel:
    """An expert-parallel card past the first: its share of every MoE layer's experts (and the routers
    its predictions need), nothing else (engine/parallel/experts.py)."""

    def __init__(self, config, path: str, rank: int, world: int) -> None:
        from engine.checkpoint import families as fn
        from engine.checkpoint.converted import ConvertedSource, is_converted
        from engine.checkpoint.fp8_blocks import with_fp8_blocks
        from engine.checkpoint.loader import _Fetch, pack_layer_experts
        from engine.checkpoint.plan import router_bias_name, score_bias_name
        from engine.checkpoint.reader import SafetensorsReader, with_aliases
        from engine.checkpoint.spec import read_spec
        from engine.config import DIRECT_READS
        from engine.experts.manager import ExpertManager
        from engine.loading import expert_layout, resolve_device, resolve_dtype
        from engine.memory import decode_experts, default_budget, plan_memory, staging_slots, step_sizing
        from engine.models.moe_transformer import route_ref
        from engine.options import pool_bytes
        from engine.parallel.experts import ExpertShard, shard_rows
        folder = Path(path)
        self._pool_bytes = pool_bytes
        self.config = config
        self.spec = spec = read_spec(folder)
        source = ConvertedSource(folder, verify=False) if is_converted(folder) else SafetensorsReader(folder)
        source = with_aliases(with_fp8_blocks(source, spec), spec.family.aliases)
        self.device = device = resolve_device(config.device)
        self.dtype = dtype = resolve_dtype(config.dtype, device)
        self.layout = layout = expert_layout(config, spec, dtype)
        self.shard = ExpertShard(rank, world, spec.num_experts)
        own, E = self.shard.experts, spec.num_experts
        fetch = _Fetch(source, device, dtype)
        full = torch.empty(E, layout.nbytes, dtype=torch.uint8)
        layers, routers, biases, choice = [], [], [], []
        moe_index = 0
        for i in range(spec.num_layers):
            if not spec.moe_layers[i]:
                continue
            if hasattr(source, "read_experts"):
                source.read_experts(moe_index, full)
            else:
                pack_layer_experts(fetch, spec, i, layout, full)
            layers.append(shard_rows(full, E, own))
            p = spec.family.moe_prefix.format(i=i)
            get = lambda name: source.get(name).to(device=device, dtype=dtype)     # noqa: E731
            routers.append(get(spec.family.router.format(p=p))[own] * get(fn.POST_NORM.format(i=i)))
            if spec.family.router_bias:
                biases.append(get(router_bias_name(spec, i))[own])
            if spec.family.score_bias:
                choice.append(source.get(score_bias_name(spec, i)).to(device=device, dtype=torch.float32)[own])
            moe_index += 1
        rows = torch.cat(layers, 0)
        del full, layers
        self.resident_bytes = sum(r.numel() * r.element_size() for r in routers + biases + choice)
        per_layer = len(own)
        budget = None if device.type != "cuda" else \
            (config.gpu_memory_budget if config.gpu_memory_budget is not None else default_budget(device))
        self.plan = plan_memory(self.resident_bytes, layout.nbytes, spec.num_moe_layers * per_layer, 0, budget,
                                self.pool_bytes(config.expert_pool_size), experts_per_layer=per_layer,
                                active_experts_per_token=spec.num_moe_layers * spec.top_k, min_kv_tokens=0,
                                **step_sizing(spec, config, torch.empty((), dtype=self.dtype).element_size(),
                                              gpu=device.type == "cuda"))
        top_k = min(spec.top_k, per_layer)
        room = None if budget is None else budget - self.resident_bytes - self.plan.workspace_bytes
        self.experts = ExpertManager.from_rows(
            layout, rows, per_layer, device, self.plan.pool_slots * layout.nbytes, config.prefetch_depth,
            config.expert_policy, routers, lambda logits: route_ref(logits, top_k, spec.renormalize),
            budget_bytes=room, direct_reads=DIRECT_READS[config.expert_reads], top_k=top_k,
            staging_slots=self.plan.staging_slots or staging_slots(per_layer, decode_experts(spec, config)),
            router_bias=biases or None, norm_eps=spec.rms_norm_eps, cold_experts="bus", score_bias=choice or None)
        from kernels.fused_moe import fused_moe_ref
        self.moe_fn = fused_moe_ref
        if device.type == "cuda":
            from kernels._triton import HAS_TRITON
            if HAS_TRITON:
                from kernels.fused_moe import fused_moe
                self.moe_fn = fused_moe

    def pool_bytes(self, size) -> int | None:
        """A pool size as this card takes it: a share of its experts, or its share of a size in bytes."""
        if isinstance(size, int):
            size = int(size * self.shard.local_experts / self.spec.num_experts)
        return self._pool_bytes(size, self.layout.nbytes * self.spec.num_moe_layers * self.shard.local_experts)

    def pool_request(self, value: object) -> int | None:
        from engine.options import parse_live
        return self.pool_bytes(parse_live("expert_pool_size", value))

    def memory(self):
        from engine.telemetry import MemoryStats
        store = self.experts.store
        cuda = self.device.type == "cuda"
        return MemoryStats(resident_bytes=self.resident_bytes, expert_pool_bytes=self.experts.stats().pool_bytes,
                           workspace_bytes=self.plan.workspace_bytes if self.plan.budget_bytes is not None else 0,
                           budget_bytes=self.plan.budget_bytes, pinned_host_bytes=0 if store is None else store.nbytes,
                           max_allocated_bytes=torch.cuda.max_memory_allocated(self.device) if cuda else 0)

    def close(self) -> None:
        self.experts.close()


class Links:
    """This stage's groups: ``links`` (every rank: the steps' way down, expert parallel's collectives)
    and ``back`` (ranks 0 and world - 1: the last stage's way back to the first)."""

    def __init__(self, rank: int, world: int, link_s: float) -> None:
        self.rank, self.world = rank, world
        # created in the order rank 0 creates them (engine/parallel/pipeline.py Pipeline._start)
        self.links = dist.new_group(timeout=timedelta(seconds=link_s))
        self.back = dist.new_group(ranks=[0, world - 1], timeout=timedelta(seconds=link_s))

    def warm_up(self, token: torch.Tensor, experts: bool) -> tuple[int, int] | None:
        """This stage's share of the warm-up at load (engine/parallel/pipeline.py Pipeline.warm_up): the
        edge it sent on, or None for expert parallel's one broadcast over every card."""
        if experts:
            dist.broadcast(token, src=0, group=self.links)
            return None
        self.recv(token)
        return self.send_on(token)

    def recv(self, t: torch.Tensor, tag: int = 0) -> None:
        dist.recv(t, src=self.rank - 1, tag=tag, group=self.links)

    def send_on(self, t: torch.Tensor, tag: int = 0) -> tuple[int, int]:
        """Send ``t`` to the next stage (the last stage: back to the first); the edge it took."""
        if self.rank + 1 < self.world:
            dist.send(t, dst=self.rank + 1, tag=tag, group=self.links)
            return self.rank, self.rank + 1
        dist.send(t, dst=0, tag=tag, group=self.back)
        return self.rank, 0


@torch.inference_mode()
def _expert_step(m: ShardModel, tokens: int, rank: int, world: int, links: Links, prompt: bool) -> None:
    """One step's MoE layers on this card: its share of each, summed into card 0's; ``prompt``: the step
    carries a prompt's tokens (engine/experts/manager.begin_step)."""
    from engine.parallel.experts import shard_share, unpack_tokens
    s = m.spec
    D, k = s.hidden, s.top_k
    m.experts.begin_step(prompt=prompt)
    try:
        for moe_index in range(s.num_moe_layers):
            msg = torch.empty(tokens, 2 * D + 2 * k, dtype=torch.float32, device=m.device)
            dist.broadcast(msg, src=0, group=links.links)
            h, x, ids, w = unpack_tokens(msg, D, k, m.dtype)
            pred = m.experts.before_layer(moe_index, x)
            share = shard_share(m.experts, m.moe_fn, m.layout, moe_index, h, ids, w, pred, world, rank)
            dist.reduce(share, dst=0, group=links.links)
    finally:
        m.experts.end_step()


def _own_options(m, options: dict) -> dict:
    """The live options that concern this process's card (a shard keeps no KV cache)."""
    return {k: v for k, v in options.items() if not (isinstance(m, ShardModel) and k == "kv_cache_dtype")}


def _serve(m, conn, rank: int, world: int, links: Links) -> None:
    from engine.live import apply_to_stage, check_stage
    D, dtype, device = m.spec.hidden, m.dtype, m.device
    windowed = bool(m.cache.window_blocks) if not isinstance(m, ShardModel) else False
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return                                    # the engine's process is gone
        kind = msg[0]
        if kind == "experts_step":                    # expert parallel: this card's share of every MoE layer
            _expert_step(m, msg[1], rank, world, links, msg[2])
        elif kind == "step":                          # one micro-batch of a step, in the order they come
            _, parts, tag = msg
            batch = parts.build(m.cache.block_size, device, windowed)
            act = torch.empty(2, parts.num_tokens, D, dtype=dtype, device=device)      # [2, T, D]
            links.recv(act, tag)
            x, out = m.model.layers(act[0], act[1], batch, m.cache)
            links.send_on(torch.stack([x, out]).contiguous(), tag)
        elif kind == "warm_up":                       # every link's communicator built before the first step
            conn.send(("warmed", links.warm_up(torch.zeros(1, device=device), isinstance(m, ShardModel))))
        elif kind == "check":                         # a live change, checked before any stage applies it
            try:
                check_stage(m, _own_options(m, msg[1]))
                conn.send(("checked", None))
            except StrataError as e:                  # refused (a bad value, or its card cannot hold it)
                conn.send(("checked", str(e)))
        elif kind == "reconfigure":
            try:
                conn.send(("reconfigured", None, apply_to_stage(m, _own_options(m, msg[1]), msg[2])))
            except StrataError as e:                  # accepted, yet failed (an allocation)
                conn.send(("reconfigured", str(e), {}))
        elif kind == "stats":
            conn.send(("stats", _stats(m, rank)))
        elif kind == "close":
            return


def _join(start: dict) -> Links:
    """Join the process group: marked in the first stage's store just before, so that the first
    stage joins only once every stage is there (and sees at once one that ended before)."""
    rank, world, backend = start["rank"], start["world"], start["backend"]
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", start["store"], world, is_master=False,
                          timeout=timedelta(seconds=start["rendezvous_s"]))
    store.set(f"joined/{rank}", "1")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=start["rendezvous_s"]))
    return Links(rank, world, start["link_s"])


def main(conn) -> None:
    """Serve one stage over ``conn``: its start message first (engine/parallel/pipeline.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        start = conn.recv()
    except (EOFError, OSError):
        os._exit(1)
    run(conn, start)


def run(conn, start: dict) -> None:
    m = None
    code = 0
    try:
        rank, world = start["rank"], start["world"]
        config, path, plan = start["config"], start["path"], start["plan"]
        _watch_parent(start["parent"])
        links = _join(start)
        m = ShardModel(config, path, rank, world) if start["mode"] == "experts" else _load(config, path, plan, rank, conn)
        conn.send(("loaded",))
        _serve(m, conn, rank, world, links)
    except BaseException as e:        # reported to the engine's process, which stops the pipeline
        code = 1
        kind = type(e).__name__ if isinstance(e, StrataError) else "PipelineError"
        text = str(e) if isinstance(e, StrataError) else f"{type(e).__name__}: {e}"
        if isinstance(e, torch.OutOfMemoryError):
            kind, text = "PipelineError", f"the GPU ran out of memory ({e})".split("\n")[0]
        try:
            conn.send(("error", kind, text))
        except (BrokenPipeError, ConnectionError, EOFError, OSError):
            pass
    finally:
        if m is not None:
            try:
                m.close()
            except Exception:
                pass
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    os._exit(code)


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection
    main(Connection(int(sys.argv[1])))
