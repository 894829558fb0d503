"""Prefetch without the host: the GPU copies predicted experts into staging slots while it computes.

In a direct-read decode step (engine/experts/direct.py) the host only follows the GPU: by the time it
has read a layer's prediction and issued a copy, the layer it was for has often begun, and the copy
is wasted. Here the prediction never leaves the device. Right after layer ``l`` predicts the experts
of layer ``t = l + depth`` (the farthest it looks), two kernels on a stream of their own take over:

* ``claim`` (one program) orders the experts predicted for ``t`` by how many tokens predict them,
  ties by rank (every token's first choice, then every second choice, ...), keeps those that have no
  slot in the table, and gives the first ``quota`` of them the next of the step's leased staging
  slots (an expert several tokens of a batch will need is the likeliest to be used); an expert fewer
  tokens predict than the step's ``min_votes`` is not claimed (:class:`ClaimGate` measures how often
  claims with each number of votes are used). Each
  claimed entry of the slot table is marked ``CLAIMED`` (still "missing" to every reader), and the
  claims are listed for the copy kernel and, in pinned memory, for the host. It claims nothing once
  the compute stream has published layer ``t - 1``: such a copy could not land in time.
* ``copy`` (a few persistent programs) moves the claimed experts' bytes from the mapped host store
  into their slots in 256 KiB chunks; the program that completes an expert's last chunk publishes
  its slot in the table with release semantics, so a snapshot that sees the slot also sees its
  bytes. A layer whose snapshot was taken before that reads the expert directly, as before.

The stream forks from the compute stream at each launch and joins it at the end of the step, so a
step recorded into one CUDA graph carries its prefetches with it. At the step's end the host reads
the claims (``collect``), counts an expert whose layer found it in its slot as a prefetch hit,
offers those to the pool like fills, and clears the table entries of the rest.

On the CPU (and for eager steps there) :meth:`DevicePrefetcher.launch` does the same in torch,
synchronously: every claimed expert lands before its layer.
"""
from __future__ import annotations

import time

import torch

from engine.experts.readback import pinned_ids
from engine.gil import offer_gil
from engine.host_copy import host_to
from kernels._triton import HAS_TRITON
from kernels.expert_claim import (CHUNK_WORDS, CLAIMED, COPY_BLOCK, ClaimBuffers, claim_and_copy, claim_and_copy_ref,
                                  land_claims)

__all__ = ["CLAIMED", "DevicePrefetcher"]

UNWRITTEN = -2               # a claim region until its claim kernel has run


class DevicePrefetcher:
    """Device buffers, stream and host view of the GPU-side prefetch (see the module doc)."""

    chunk_words, copy_block = CHUNK_WORDS, COPY_BLOCK

    def __init__(self, num_layers: int, num_experts: int, max_claims: int, device: torch.device) -> None:
        self.device, self.num_experts, self.max_claims = device, num_experts, max_claims
        cuda = device.type == "cuda"
        self.meta = torch.zeros(6, dtype=torch.int32, device=device)   # next, count, quota, progress, n, min_votes
        self.free = torch.zeros(max(1, 2 * num_experts), dtype=torch.int32, device=device)
        self.work = torch.zeros(2 * max_claims, dtype=torch.int64, device=device)
        self.done = torch.zeros(max_claims, dtype=torch.int32, device=device)
        n = num_layers * (1 + 3 * max_claims)           # per layer: count, keys, slots, votes
        self.regions = (pinned_ids(n) if cuda else torch.zeros(n, dtype=torch.int64)).view(num_layers, -1)
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.buffers = ClaimBuffers(self.free, self.meta, self.work, self.done, self.regions, num_experts, max_claims)
        self.targets: list[int] = []        # layers a claim was launched for this step (recorded or eager)
        # On the CPU: None lands every claim at once; a list keeps them under way (CLAIMED in the
        # table) until the step's join, as on the GPU when a layer reads the table before a copy ends.
        self.ref_in_flight: list | None = None
        self._forked = False

    @staticmethod
    def usable(device: torch.device, row_bytes: int) -> bool:
        """Whether this device and row size can use it (rows copied as int32 words)."""
        return row_bytes % 4 == 0 and (device.type != "cuda" or HAS_TRITON)

    def begin(self, slots: list[int], quota: int, min_votes: int = 1) -> None:
        """Before a step: lease ``slots`` (staging slots nobody points at) and allow ``quota``
        claims per layer, each of an expert at least ``min_votes`` tokens predict; mark the claim
        regions of the recorded targets unwritten."""
        n = len(slots)
        if n:
            self.free[:n].copy_(host_to(slots, torch.int32, self.free.device))
        self.meta.copy_(host_to([0, n, quota if n else 0, -1, 0, min_votes], torch.int32, self.meta.device))
        self.targets = []
        self.regions[:, 0] = UNWRITTEN                  # one op: what collect() waits on

    def disarm(self) -> None:
        """Before a step is recorded: its claims are set up by each replay (``begin``), not now."""
        self.meta.zero_()
        self.targets = []

    def launch(self, target: int, pred: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
               pool: torch.Tensor) -> None:
        """Claim and copy predicted experts of layer ``target`` (``pred [T, k]`` on the device).

        ``table [L, E]`` int32 slot table; ``rows [L*E, nbytes]`` host store; ``pool [S, nbytes]``."""
        self.targets.append(target)
        T, k = pred.shape
        n = min(T * k, self.max_claims)
        if self.stream is None:
            self._launch_ref(target, pred, table, rows, pool, n)
            return
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        self._forked = True
        with torch.cuda.stream(self.stream):
            self.run_kernels(target, pred, table, rows, pool, n)

    def run_kernels(self, target: int, pred: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                    pool: torch.Tensor, n: int) -> None:
        """The claim and copy kernels on the current stream (what :meth:`launch` forks off)."""
        claim_and_copy(self.buffers, target, pred, table, rows, pool, n, self.chunk_words, self.copy_block)

    def _launch_ref(self, target: int, pred: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                    pool: torch.Tensor, n: int) -> None:
        """What the kernels do, in torch (CPU): claims land at once, or at the join (``ref_in_flight``)."""
        claim_and_copy_ref(self.buffers, target, pred, table, rows, pool, n, self.ref_in_flight)

    def set_progress(self, layer: int) -> None:
        """Eager steps: the compute stream has reached ``layer``'s experts (in a recorded step the
        publish kernel writes it)."""
        self.meta[3].fill_(layer)

    def join(self) -> None:
        """End of the step's device work: the compute stream waits for every prefetch."""
        if self.ref_in_flight:
            land_claims(self.ref_in_flight)
        if self.stream is not None and self._forked:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self._forked = False

    def snapshot(self, targets: list[int]):
        """A copy of the claim records of ``targets`` (waiting for their claim kernels): a step whose
        end is deferred keeps them, since the next step's claims overwrite the records."""
        if not targets:
            return None
        self._wait(targets)
        return self.regions.numpy()[targets].copy()

    def collect(self, targets: list[int], records=None) -> list[tuple[int, int, int, int]]:
        """``(key, slot, rank, votes)`` of every claim of the step's ``targets`` (their claim kernels
        have run or will shortly: the host waits for their regions), or of their ``records`` taken by
        :meth:`snapshot`; ``rank`` is the claim's place among its layer's claims, ``votes`` the tokens
        that predicted it. Plain numpy: this is on the step's path."""
        if not targets:
            return []
        if records is None:
            self._wait(targets)
            records = self.regions.numpy()[targets]
        out = []
        m = self.max_claims
        for row, n in zip(records, records[:, 0].tolist()):
            if n > 0:
                out.extend(zip(row[1:1 + n].tolist(), row[1 + m:1 + m + n].tolist(), range(n),
                               row[1 + 2 * m:1 + 2 * m + n].tolist()))
        return out

    def _wait(self, targets: list[int]) -> None:
        if self.stream is None:
            return
        arr = self.regions.numpy()
        t0 = time.perf_counter()
        while (arr[targets, 0] == UNWRITTEN).any():
            if time.perf_counter() - t0 > 10.0:
                raise RuntimeError("a prefetch claim of this step never ran")
            offer_gil()
