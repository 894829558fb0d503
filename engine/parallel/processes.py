"""The processes of a pipeline's other stages, as the engine's own process holds them.

Each stage past the first runs ``python -m engine.parallel.worker`` (so that nothing of the caller's
main module runs again there) with a socket of its own as its control pipe. Its stderr passes through
to the engine's and its last lines are kept, so that a stage that ends says why in one line. The
:class:`Crew` owns the processes and the process group together: whoever ends the pipeline (close,
a failure, the engine collected without a close, the interpreter's exit) releases both through it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path

import torch.distributed as dist

_ROOT = Path(__file__).resolve().parents[2]       # the folder holding the engine package
WORKER_ARGV: tuple[str, ...] = ("-m", "engine.parallel.worker")   # what a stage's process runs, before its pipe's number
_TAIL_LINES = 20


def signal_name(code: int) -> str:
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class StageProcess:
    """One stage's process and its control pipe."""

    def __init__(self, argv: tuple[str, ...] = WORKER_ARGV) -> None:
        here, there = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.popen = subprocess.Popen([sys.executable, *argv, str(there.fileno())], pass_fds=(there.fileno(),),
                                      env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        there.close()
        self.conn = Connection(here.detach())
        self.pid = self.popen.pid
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._reader = threading.Thread(target=self._pass_stderr, name=f"stage-stderr-{self.pid}", daemon=True)
        self._reader.start()

    def _pass_stderr(self) -> None:
        """Copy the process's stderr to ours line by line, keeping the last lines."""
        for raw in iter(self.popen.stderr.readline, b""):
            line = raw.decode(errors="replace")
            self._tail.append(line.rstrip())
            try:
                sys.stderr.write(line)
            except (OSError, ValueError):         # our stderr is closed (the interpreter is ending)
                pass
        self.popen.stderr.close()

    def last_words(self) -> str:
        """The last non-blank line the process wrote to stderr ('' if none), once it ended."""
        self._reader.join(2.0)
        return next((line.strip() for line in reversed(self._tail) if line.strip()), "")

    def how_it_ended(self) -> str:
        """``exit code 3: <its last stderr line>`` or ``killed by SIGKILL`` (a signal leaves no words)."""
        code = self.exitcode
        if code is not None and code < 0:
            return signal_name(code)
        words = self.last_words()
        return f"exit code {code}: {words}" if words else f"exit code {code}"

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()


class Worker:
    """A stage past the first: its rank, its process and the messages it sent not yet read."""

    def __init__(self, rank: int, proc: StageProcess) -> None:
        self.rank, self.proc, self.conn = rank, proc, proc.conn
        self.inbox: deque[tuple] = deque()
        self.error: tuple[str, str] | None = None      # (error class name, text) it reported, once read


class Crew:
    """The other stages' processes and this process's share of the process group.

    Holds no reference to the pipeline, so that a ``weakref.finalize`` of the pipeline can stop it."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.owns_group = False

    def stop(self, kill: bool = False) -> None:
        """Stop every stage (asked to close first unless ``kill``: killed at once, a stopped or hung
        process too) and leave the process group."""
        for w in self.workers:
            if not kill and w.proc.is_alive():
                try:
                    w.conn.send(("close",))
                except (BrokenPipeError, ConnectionError, EOFError, OSError):
                    pass
        deadline = time.monotonic() + (0.0 if kill else 20.0)
        for w in self.workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive() and not kill:
                w.proc.terminate()
                w.proc.join(5.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(5.0)
            w.conn.close()
        self.workers = []
        if self.owns_group and dist.is_initialized():
            self.owns_group = False
            try:
                dist.destroy_process_group()
            except Exception:          # a group whose peers are gone: nothing left to release
                pass
