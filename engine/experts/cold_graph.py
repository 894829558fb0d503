"""The host CPU's share of missing experts inside a replayed direct-read decode step.

A direct-read decode step is one CUDA graph (engine/cuda_graphs.py); the host follows it layer by
layer from what each layer publishes into pinned memory (engine/experts/direct.py). With a host
store and ``cold_experts`` auto or cpu, each MoE layer of such a recording also splits its missing
experts between the bus and the host CPU, with no host decision in the GPU's path and nothing
recorded again from step to step:

1. the layer's publish kernel gives the host CPU ``round(share * m)`` of its ``m`` missing experts,
   those the most tokens use first (a direct read crosses the bus once per token that uses the
   expert; the CPU reads it once; where the step gathers its shared experts, each crossing once, the
   fewest first), marks them ``SLOT_CPU`` in the slot-table snapshot, and writes the
   layer's ``x`` and routing weights into this layer's pinned ``inputs``, then its ``ready`` flag;
2. the MoE kernels skip those experts' pairs and read the other missing experts over the bus;
3. the host, following the step, sees the marks, waits for ``ready``, computes the marked experts
   with the CPU kernels (kernels/cpu) into the layer's pinned ``out`` and sets its ``done`` flag;
4. a join kernel after the layer's MoE (kernels/cpu_share.py) waits for ``done`` and adds ``out``.

The share is a number in pinned memory that the publish kernels read, set before each replay:
``cpu`` 1, ``bus`` 0, ``auto`` what :class:`ShareTuner` finds fastest for that step size. The host
always sets every ``done`` flag of a step it cannot finish, so the GPU never waits on a host that
failed; the join kernel's own time limit covers a host that stopped.

Legend: L MoE layers, T tokens of a recording, k experts per token, D hidden.
"""
from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from kernels.publish_ids import SLOT_CPU, CpuShareArgs
from engine.gil import offer_gil

if TYPE_CHECKING:
    from engine.experts.host_trace import HostTrace
    from engine.experts.residency import Residency

SHARES = tuple(i / 8 for i in range(9))        # the shares auto chooses among
JOIN_LIMIT_S = 10.0                            # the join kernel's wait for the host, at most


class ShareTuner:
    """``auto``'s share of missing experts for the host CPU, per step size: the share that the
    measured steps say is fastest. It runs the share where the cost model balances the bus and the
    CPU (``start``) and then none (the bus alone) for ``trials`` steps each, keeps the faster, then
    every ``probe_every`` steps tries a neighbouring share for ``trials`` steps and moves there when
    that was faster by ``margin`` (each share's time: the median of its last ``window`` steps, a
    probe's of its own steps, so that one step that met a compile or a busy moment does not rule a
    share out); after a move it tries the next share in the same direction at once.
    A probe step slower than the share in force by ``abandon`` ends its probe at once, and each
    probe that fails doubles the wait before the next (up to 8 times): on a host whose CPU is busy
    the shares it tries cost little. Routing, the pool and the machine's load all move the best share."""

    def __init__(self, trials: int = 3, probe_every: int = 24, window: int = 5, margin: float = 0.01,
                 abandon: float = 0.5) -> None:
        self.trials, self.probe_every, self.window, self.margin = trials, probe_every, window, margin
        self.abandon = abandon
        self._s: dict[int, dict] = {}

    def _state(self, tokens: int, start: float) -> dict:
        st = self._s.get(tokens)
        if st is None:
            i = min(range(len(SHARES)), key=lambda j: abs(SHARES[j] - start))
            st = self._s[tokens] = {"cur": i, "arm": i, "left": self.trials, "avg": {}, "dir": 1 if i == 0 else -1,
                                    "skip": True, "first": i != 0}
        return st

    def choose(self, tokens: int, start: float = 0.5) -> float:
        return SHARES[self._state(tokens, start)["arm"]]

    def suggest(self, tokens: int, start: float) -> None:
        """The cost model's balanced share is now ``start`` (its CPU rate was learnt from the steps):
        where that is two or more shares from the one in force, and no probe runs, try it next. Each
        share is suggested once until the share in force moves; a suggestion that loses leaves the
        regular probes' side and period as they were."""
        st = self._s.get(tokens)
        if st is None or st["skip"] or st.get("first") or st["arm"] != st["cur"]:
            return
        i = min(range(len(SHARES)), key=lambda j: abs(SHARES[j] - start))
        tried = st.setdefault("tried", set())       # cleared when the share in force moves
        if abs(i - st["cur"]) < 2 or i in tried:
            return
        tried.add(i)
        st["arm"], st["left"], st["suggested"] = i, self.trials, True

    def observe(self, tokens: int, seconds: float) -> None:
        st = self._s.get(tokens)
        if st is None:
            return
        if st["skip"]:                 # the size's first step records its graph
            st["skip"] = False
            return
        arm, avg, cur = st["arm"], st["avg"], st["cur"]
        # the share in force: its last steps; a probe: its own steps only (not those of an earlier probe)
        samples = st.setdefault("recent", {}).setdefault(arm, []) if arm == cur else st.setdefault("probe", [])
        samples.append(seconds)
        del samples[:-self.window]
        avg[arm] = statistics.median(samples)    # one step slowed by something else does not move it
        st["left"] -= 1
        if arm != cur and cur in avg and seconds > avg[cur] * (1 + self.abandon):
            st["left"] = 0             # a probe far slower than the share in force ends at once
        if st["left"] > 0:
            return
        if st.pop("first", False):     # the balanced share ran: now the bus alone
            st["arm"], st["left"] = 0, self.trials
            return
        if arm != cur:                 # a probe ended: keep the faster
            probe, st["probe"] = st.get("probe", []), []
            moved = avg[arm] < avg[cur] * (1 - self.margin)
            suggested = st.pop("suggested", False)
            if moved:
                st["recent"][arm] = probe
                st["dir"] = 1 if arm > cur else -1
                st["cur"], st["every"] = arm, self.probe_every
                st.get("tried", set()).clear()
            elif not suggested:        # probe the other side next, and less often while probes fail
                st["dir"] = -st["dir"]
                st["every"] = min(8 * self.probe_every, 2 * st.get("every", self.probe_every))
            st["arm"], st["left"] = st["cur"], 1 if moved else st.get("every", self.probe_every)
            return
        nxt = st["cur"] + st["dir"]
        if not 0 <= nxt < len(SHARES):
            st["dir"] = -st["dir"]
            nxt = st["cur"] + st["dir"]
        st["arm"], st["left"] = nxt, self.trials

    def probing(self, tokens: int) -> bool:
        """Whether the next step of ``tokens`` tokens measures a share other than the one in force (a
        probe, the first trials) or is not a measure at all (after a recording; before the first)."""
        st = self._s.get(tokens)
        return st is None or st["skip"] or bool(st.get("first")) or st["arm"] != st["cur"]

    def measuring_in_force(self, tokens: int) -> bool:
        """Whether the next step of ``tokens`` tokens is a measure of the share in force (not a probe of
        another, not the step after a recording)."""
        st = self._s.get(tokens)
        return st is not None and not st["skip"] and st["arm"] == st["cur"]

    def state(self) -> dict[int, tuple[float, dict[float, float]]]:
        """Step size -> (share in force, average step seconds by share tried)."""
        return {t: (SHARES[st["cur"]], {SHARES[i]: v for i, v in sorted(st["avg"].items())})
                for t, st in sorted(self._s.items())}

    def recorded(self) -> None:
        """A step was recorded (again): the next step of each size may record or run after a recording,
        so its time is not a measure."""
        for st in self._s.values():
            st["skip"] = True

    def reset(self) -> None:
        self._s.clear()


class _Buffers:
    """One recording's pinned buffers: per MoE layer the inputs ``[T * D + T * k]``, the host's sum
    ``[T * D]`` and the flags ``(ready, done)``; all mapped into the GPU's address space."""

    def __init__(self, layers: int, t: int, k: int, d: int, pin: bool) -> None:
        self.t, self.k, self.d = t, k, d
        with torch.inference_mode(False):      # made while a step is recorded; the host writes them later
            self.inputs = torch.zeros(layers, t * d + t * k, dtype=torch.float32, pin_memory=pin)
            self.out = torch.zeros(layers, t * d, dtype=torch.float32, pin_memory=pin)
            self.flags = torch.zeros(layers, 2, dtype=torch.int32, pin_memory=pin)
        # numpy views of the same memory, made once: the host reads and writes them every layer
        self.np = SimpleNamespace(inputs=self.inputs.numpy(), out=self.out.numpy(), flags=self.flags.numpy())


class GraphCpuLayer:
    """What a recorded MoE layer does around its kernels (see the module docstring): ``start(x, w)``
    launches the layer's publish with the host CPU's share, ``add_to(out)`` the join."""

    in_graph = True

    def __init__(self, shares: "GraphCpuShares", buffers: _Buffers, moe_index: int, ids: torch.Tensor,
                 snap: torch.Tensor, publish: Callable[[CpuShareArgs], None]) -> None:
        self.shares, self.buffers, self.moe_index = shares, buffers, moe_index
        self.ids, self.snap, self._publish = ids, snap, publish

    def start(self, x: torch.Tensor, w: torch.Tensor) -> None:
        b, i = self.buffers, self.moe_index
        self._publish(CpuShareArgs(x, w.reshape(-1), b.inputs[i], b.flags[i, 0:1], self.shares.frac))

    def add_to(self, out: torch.Tensor) -> torch.Tensor:
        from kernels.cpu_share import cpu_share_join, cpu_share_join_ref
        b, i = self.buffers, self.moe_index
        join = cpu_share_join if out.device.type == "cuda" else cpu_share_join_ref
        return join(out, self.ids, self.snap, b.flags[i, 1:2], b.out[i], self.shares.err, JOIN_LIMIT_S)


class GraphCpuShares:
    """The host side: the recordings' buffers, the share in force and the host CPU's work per layer."""

    def __init__(self, r: "Residency", hidden: int, gathers: Callable[[int], bool] = lambda tokens: False,
                 per_recording: bool = True) -> None:
        self.r, self.hidden = r, hidden
        self.gathers = gathers           # whether a step of that many tokens copies its shared experts once
        pin = r.device.type == "cuda"
        with torch.inference_mode(False):      # made while a step is recorded; the host writes them later
            self.frac = torch.zeros(1, dtype=torch.float32, pin_memory=pin)   # read by the publish kernels
            self.err = torch.zeros(1, dtype=torch.int32, pin_memory=pin)      # set by a join that gave up
        # one tuner per recording (quiet, predicting: engine/experts/predict_tuner.py), each tuned on the
        # steps of its own recording, so that a probe of the other recording runs at that one's best share
        self.tuners: dict[bool, ShareTuner] = {}
        self.set_per_recording(per_recording)
        self.recording = False           # the recording the next replay runs: whose tuner ``tuner`` is
        self.hold = False                # the replays' other tuner measures now: no suggested share starts
        self._suggested = False          # this step's suggestion was made already (``suggest``)
        self._bufs: dict[tuple[int, int], _Buffers] = {}
        self._run = None                 # the CPU kernels' runner, made at the first share
        self.tokens = 0                  # the running step's real tokens
        self._pending: list[tuple] = []  # the step's layers that computed experts, for settle()
        self.trace: HostTrace | None = None      # the host's timeline (engine/experts/host_trace.py)

    @property
    def tuner(self) -> ShareTuner:
        """The CPU share's tuner of the recording selected (:meth:`select`)."""
        return self.tuners[self.recording]

    def select(self, predicting: bool) -> None:
        """The next replay runs the ``predicting`` recording (or the quiet one): its share and time are
        that recording's tuner's. The shares best with and without predictions differ: predicting steps
        copy some missing experts in ahead, so the CPU is left fewer, and a share tuned on one recording
        would make a probe of the other read slower than it is."""
        self.recording = bool(predicting)

    def set_per_recording(self, on: bool) -> None:
        """A share tuner per recording (``on``), or one for both; either way starting anew."""
        quiet = ShareTuner()
        self.tuners = {False: quiet, True: ShareTuner() if on else quiet}

    def recorded(self) -> None:
        """The steps were recorded (again): the next step of each size is not a measure for either tuner."""
        for tuner in self.tuners.values():
            tuner.recorded()

    def reset(self) -> None:
        for tuner in self.tuners.values():
            tuner.reset()

    def layer(self, moe_index: int, ids: torch.Tensor, snap: torch.Tensor,
              publish: Callable[[CpuShareArgs], None]) -> GraphCpuLayer:
        t, k = ids.shape
        key = (t, k)
        if key not in self._bufs:
            self._bufs[key] = _Buffers(self.r.num_layers, t, k, self.hidden, self.r.device.type == "cuda")
        self.recorded()                      # the next steps record: not a measure
        return GraphCpuLayer(self, self._bufs[key], moe_index, ids, snap, publish)

    # ---- each replay -------------------------------------------------------------------------------
    def share_for(self, tokens: int) -> float:
        cold = self.r.cold
        if cold.mode != "auto":
            return 1.0 if cold.mode == "cpu" else 0.0
        balanced = self.balanced()
        if not self.hold and not self._suggested:
            self.tuner.suggest(tokens, balanced)
        self._suggested = False
        return self.tuner.choose(tokens, balanced)

    def suggest(self, tokens: int) -> None:
        """Offer the tuner the cost model's balanced share before the next step of ``tokens`` tokens is
        planned (where another tuner must know whether that step will be a probe); ``share_for`` then
        makes no suggestion of its own for that step."""
        if self.r.cold.mode == "auto":
            self.tuner.suggest(tokens, self.balanced())
        self._suggested = True

    def balanced(self) -> float:
        """The share at which the bus and the CPU take equally long for one token's missing experts,
        from the measured rates (one expert: its bytes over the bus, as the step's kernels read it,
        against the CPU's time)."""
        rates = self.r.cold.rates
        if rates is None:
            return 0.5
        bus, cpu = rates.bus_s(self.r.layout.nbytes, direct=True), rates.cpu_s(1)   # the kernels move the bus's bytes
        return bus / (bus + cpu)

    def check(self) -> None:
        """Raise if a join of the last replay gave up waiting for the host (its output is not valid)."""
        err = self.err.numpy()
        if err[0] != 0:
            err[0] = 0
            raise RuntimeError(f"the host CPU's share of a MoE layer did not arrive within {JOIN_LIMIT_S:.0f} s, so "
                               "this decode step's output is not valid; if the machine is overloaded, set "
                               "cold_experts to bus")

    def begin(self, tokens: int) -> None:
        """Before a replay of ``tokens`` real tokens: the flags cleared, the share set."""
        self.check()
        cold = self.r.cold
        if cold.mode != "bus" and cold.rates is None and self.r.store is not None:
            cold.measure(self.r.store.rows, self.r.device)
        for b in self._bufs.values():
            b.np.flags[:] = 0
        self._pending = []                    # a step that was not followed to its end counts nothing
        self.tokens = tokens
        self.frac.numpy()[0] = self.share_for(tokens)

    def in_force(self, recording: Callable[[int], bool]) -> tuple[tuple[int, float], ...]:
        """(tokens, share) for every step size replayed so far: auto's current choice for the recording
        that size replays (``recording(tokens)``: whether it predicts)."""
        tuned = {p: t.state() for p, t in self.tuners.items()}
        sizes = sorted(set(tuned[False]) | set(tuned[True]) | ({self.tokens} if self.tokens else set()))
        if self.r.cold.mode != "auto":
            return tuple((t, self.share_for(t)) for t in sizes)
        return tuple((t, tuned[bool(recording(t))].get(t, (0.0,))[0]) for t in sizes)

    def observe(self, tokens: int, seconds: float) -> None:
        """A replayed step took ``seconds``: to the tuner of its recording (selected as it started)."""
        if self.r.cold.mode == "auto":
            self.tuner.observe(tokens, seconds)

    def release(self) -> None:
        """Let every join of the running step pass (the host cannot finish its share)."""
        for b in self._bufs.values():
            b.np.flags[:, 1] = 1

    # ---- following the step ----------------------------------------------------------------------
    def compute(self, moe_index: int, t: int, k: int, rows: int, ids: list[int], seen: list[int],
                finished: Callable[[], bool]) -> int:
        """Layer ``moe_index``'s marked experts (``seen`` ``SLOT_CPU``, of its ``rows`` real tokens) on
        the host CPU, into the layer's ``out``; then its ``done`` flag. Returns how many experts.
        Every layer of the step waits for this, so the counts wait for :meth:`settle`."""
        from kernels.cpu import CpuExpertWork
        r = self.r
        t0 = time.perf_counter()
        flags = self._bufs[(t, k)].np.flags[moe_index]
        while flags[0] == 0:                          # the inputs are written after the ids
            if finished() and flags[0] == 0:
                raise RuntimeError(f"the decode graph finished without handing MoE layer {moe_index}'s "
                                   "inputs to the host CPU")
            offer_gil()
        if self.trace is not None:
            self.trace.mark(moe_index, "ready")
        # the marked pairs grouped by expert (ascending), each expert's pairs in order: plain lists, as
        # a step's few pairs take longer through numpy's calls than through Python's loops
        groups: dict[int, list[int]] = {}
        for p, slot in enumerate(seen):
            if slot == SLOT_CPU:
                groups.setdefault(ids[p], []).append(p)
        experts = sorted(groups)
        order, starts = [], [0]
        for e in experts:
            order += groups[e]
            starts.append(len(order))
        d = self.hidden
        view = self._bufs[(t, k)].np
        inputs, out = view.inputs[moe_index], view.out[moe_index]
        pairs = np.array(order, dtype=np.int64)
        work = CpuExpertWork(np.array(experts, dtype=np.int64) + moe_index * r.num_experts,
                             np.array(starts, dtype=np.int64), pairs // k, inputs[t * d + pairs])
        c0 = time.perf_counter()
        self._runner().run(work, inputs[:rows * d].reshape(rows, d), out[:rows * d].reshape(rows, d))
        out[rows * d:] = 0.0                                                 # padding rows add nothing
        done = time.perf_counter()
        flags[1] = 1
        if self.trace is not None:
            self.trace.mark(moe_index, "computed")
        # what the counts and the cost model learn from this layer waits for the step's end (settle):
        # the GPU's next layer is on its way and the host's next publish is due
        self._pending.append((t, ids, seen, groups, done - c0, done - t0))
        return len(experts)

    def settle(self, learn: bool = True) -> None:
        """After the step's last layer was followed (the host then waits for the GPU's end): count the
        step's CPU experts and (``learn``) move the cost model's CPU rate by what its layers took."""
        cold, pending, self._pending = self.r.cold, self._pending, []
        learnt = []
        for t, ids, seen, mine, cpu_s, measured_s in pending:
            cpu_uses = [len(pairs) for pairs in mine.values()]     # every pair of a CPU expert is the CPU's
            bus: dict[int, int] = {}                                  # the bus's experts -> pairs
            for e, slot in zip(ids, seen):
                if slot < 0 and slot != SLOT_CPU:
                    bus[e] = bus.get(e, 0) + 1
            bus_uses = list(bus.values())
            if self.gathers(t):              # the bus's shared experts crossed once
                bus_uses = [1] * len(bus_uses)
            cold.note_graph(len(mine), cpu_s * 1e3, measured_s * 1e3, self._predicted_ms(cpu_uses, bus_uses))
            learnt.append((cpu_s, cpu_uses))
        if learn:
            cold.learn_cpu_layers(learnt)

    def _runner(self):
        from kernels.cpu import CpuExpertRunner
        threads = self.r.cold.threads
        if self._run is None or self._run.threads != threads:
            self._run = CpuExpertRunner(self.r.store.rows, self.r.layout, threads)
        return self._run

    def _predicted_ms(self, cpu: list[int], bus: list[int]) -> float:
        """What the rates predict for the layer: the slower of the CPU's experts and the bus's direct
        reads (one per token); each list: tokens per expert."""
        rates = self.r.cold.rates
        if rates is None:
            return 0.0
        bus_s = rates.bus_s(self.r.layout.nbytes, sum(bus), direct=True)     # linear in the reads
        cpu_s = rates.cpu_call_s + rates.cpu_s_sum(cpu)
        return max(bus_s, cpu_s) * 1e3
