"""The conversation store's writer thread.

An fsync can block for a long time on a busy or slow disk, and the GUI must never wait for one, so the
chat hands snapshots to this thread. Jobs run in the order they were given; a save replaces a save of
the same conversation that is still waiting, so a streaming reply costs at most one write at a time.
A save that failed is tried again with the next job (the user's next change), and once more when the
window closes; one that fails then too is copied to a rescue folder, named in the log and on stderr.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from app.conversations import ConversationStore, write_error_line

log = logging.getLogger(__name__)


class Job(Protocol):
    conv_id: str

    def run(self, store: ConversationStore) -> None: ...

    def error_line(self, store: ConversationStore, exc: OSError) -> str: ...


@dataclass(frozen=True)
class SaveJob:
    """Write this snapshot (``Conversation.to_json()``, taken on the GUI thread)."""

    conv_id: str
    data: dict

    def run(self, store: ConversationStore) -> None:
        store.write(self.conv_id, self.data)

    def error_line(self, store: ConversationStore, exc: OSError) -> str:
        return write_error_line(store.folder, exc)


@dataclass(frozen=True)
class TrashJob:
    conv_id: str

    def run(self, store: ConversationStore) -> None:
        store.trash(self.conv_id)

    def error_line(self, store: ConversationStore, exc: OSError) -> str:
        return (f"{store.path_of(self.conv_id)} could not be moved to {store.trash_folder}: "
                f"{exc.strerror or exc}. It stays where it is; make the folder writable to delete it.")


@dataclass(frozen=True)
class RestoreJob:
    conv_id: str

    def run(self, store: ConversationStore) -> None:
        store.restore(self.conv_id)

    def error_line(self, store: ConversationStore, exc: OSError) -> str:
        return (f"{store.trash_folder / (self.conv_id + '.json')} could not be moved back: {exc.strerror or exc}. "
                f"It is still in the trash folder; make {store.folder} writable.")


@dataclass(frozen=True)
class WriteResult:
    job: Job
    error: str | None        # one line when the job failed, else None


def rescue_folders(store_folder: Path) -> list[Path]:
    """Where ``close`` copies a chat the store folder would not take: beside that folder, in the home
    folder, in the temporary folder (the first that can be written)."""
    name = "Strata unsaved chats"
    return [store_folder.parent / name, Path.home() / name, Path(tempfile.gettempdir()) / name]


class StoreWriter:
    """Runs store jobs on a thread that lives while there is work; ``on_result`` is called on that thread
    after each job."""

    def __init__(self, store: ConversationStore, on_result: Callable[[WriteResult], None]) -> None:
        self.store = store
        self._on_result = on_result
        self._jobs: deque[Job] = deque()
        self._failed: dict[str, SaveJob] = {}
        self._busy = False           # a job is running (or its result is being told)
        self._running = False        # a thread is serving the queue
        self._closed = False
        self._cond = threading.Condition()
        self.rescued: list[Path] = []     # copies of chats the store folder would not take, made at close

    def put(self, job: Job) -> None:
        """Queue ``job`` (returns at once); failed saves of other conversations are queued again first.

        After ``close`` (the window is closing) the job runs at once on the caller's thread.
        """
        if self._closed:
            self._report(WriteResult(job, self._do(job)))
            return
        with self._cond:
            retry = [f for cid, f in self._failed.items() if cid != job.conv_id or not isinstance(job, SaveJob)]
            self._failed.clear()
            for old in retry:
                self._queue(old)
            self._queue(job)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="strata-store", daemon=True).start()

    def _queue(self, job: Job) -> None:
        if isinstance(job, SaveJob):
            for i in range(len(self._jobs) - 1, -1, -1):
                if self._jobs[i].conv_id == job.conv_id:
                    if isinstance(self._jobs[i], SaveJob):
                        self._jobs[i] = job        # nobody needs the older snapshot any more
                        return
                    break                          # a trash or restore comes first: keep the order
        self._jobs.append(job)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued job has run and been told; False if ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout_s)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Finish the queued jobs, then try each save that failed once more (the disk may have room again)
        and copy any that fails again to a rescue folder (``rescued``); later jobs run at once on the
        caller's thread. False if time ran out or a save is only in the rescue folder."""
        done = self.flush(timeout_s)
        self._closed = True
        with self._cond:
            failed, self._failed = list(self._failed.values()), {}
        saved = True
        for job in failed:
            error = self._do(job)
            if error is not None:
                saved, error = False, self._rescue(job, error)
            self._report(WriteResult(job, error))
        return done and saved

    def _rescue(self, job: SaveJob, error: str) -> str:
        """Write ``job``'s snapshot where it can go (the first of :func:`rescue_folders` that takes it);
        returns the line to tell, which names that copy or says none could be made."""
        name = f"{job.conv_id}.json"
        text = json.dumps(job.data, ensure_ascii=False, indent=1)
        for folder in rescue_folders(self.store.folder):
            made = not folder.exists()
            path, part = folder / name, folder / f".{name}.{os.getpid()}.part"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                part.write_text(text, encoding="utf-8")   # whole, or not at all: a full disk leaves no empty copy
                os.replace(part, path)
            except OSError:
                _forget(part, folder if made else None)
                continue
            self.rescued.append(path)
            log.error("%s; a copy of the chat is in %s", error, path)
            return (f"{error} A copy of the chat is in {path}: move it into {self.store.folder} once that "
                    "can be written.")
        log.error("%s; no copy of the chat could be written anywhere", error)
        return error

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    self._running = False
                    return
                job = self._jobs.popleft()
                self._busy = True
            error = self._do(job)
            with self._cond:
                if error is not None and isinstance(job, SaveJob) and not self._has_save(job.conv_id):
                    self._failed[job.conv_id] = job
            self._report(WriteResult(job, error))
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _report(self, result: WriteResult) -> None:
        try:
            self._on_result(result)
        except RuntimeError:        # the receiver is gone (the window closed): nothing left to tell
            log.debug("store result after the chat closed", exc_info=True)

    def _do(self, job: Job) -> str | None:
        try:
            job.run(self.store)
        except OSError as exc:
            return job.error_line(self.store, exc)
        return None

    def _has_save(self, conv_id: str) -> bool:
        return any(isinstance(j, SaveJob) and j.conv_id == conv_id for j in self._jobs)


def _forget(part: Path, made: Path | None) -> None:
    """Remove a rescue copy cut short, and the folder made for it if nothing else is in it."""
    try:
        part.unlink(missing_ok=True)
        if made is not None:
            made.rmdir()
    except OSError:
        pass
