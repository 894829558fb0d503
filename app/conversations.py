"""Conversations on disk: one JSON file each.

A file is written whole or not at all (temporary file, fsync, rename, fsync of the folder), so a crash
leaves either the old or the new version. Nothing is ever unlinked: a deleted conversation moves to the
``trash`` subfolder (and can be moved back), and a file that cannot be read is renamed aside
(``x.json`` -> ``x.corrupt-<time>.json``) and reported.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

# 2: assistant messages carry their alternative replies and an ``interrupted`` flag. Version-1 files load
# unchanged, and an older Strata reading a version-2 file still sees each message's chosen reply.
FORMAT_VERSION = 2
TRASH = "trash"
CORRUPT_TAG = ".corrupt-"
STALE_TMP_S = 600          # a temporary copy this old is a killed process's leftover, not a write in progress
_TEMPORARY = re.compile(r"\.(.+)\.[a-z0-9_]{8}\.tmp")      # tempfile.mkstemp(prefix=".<id>.", suffix=".tmp")
_NEW_ID = re.compile(r"[0-9a-f]{12}")                      # Conversation's own ids
ROLES = ("user", "assistant")


class CorruptConversation(ValueError):
    """A conversation file whose content is not a conversation; the message names the field."""


class NewerConversation(Exception):
    """A conversation file of a later format than this Strata writes: left as it is (a save here would
    drop what this version does not know)."""


@dataclass
class Reply:
    """One reply the model gave to a turn."""

    content: str
    stats: str = ""                # the summary line shown under it
    interrupted: bool = False      # still streaming when last saved: Strata stopped before it finished
    reasoning: str = ""            # what a reasoning model thought before answering


@dataclass
class StoredMessage:
    """A user message, or an assistant turn with every reply the model gave to it.

    ``content``, ``stats`` and ``interrupted`` are always those of the chosen reply (what the model sees in
    later turns); ``alternatives`` holds all replies in the order they were made once there is more than one.
    """

    role: str                      # "user" | "assistant"
    content: str
    stats: str = ""
    interrupted: bool = False
    alternatives: list[Reply] = field(default_factory=list)
    chosen: int = 0                # index into alternatives
    reasoning: str = ""            # the chosen reply's reasoning

    def replies(self) -> list[Reply]:
        if self.alternatives:
            return list(self.alternatives)
        return [Reply(self.content, self.stats, self.interrupted, self.reasoning)]

    def set_reply(self, content: str, stats: str = "", interrupted: bool = False, reasoning: str = "") -> None:
        """Change the chosen reply (a streaming reply grows through this)."""
        self.content, self.stats, self.interrupted, self.reasoning = content, stats, interrupted, reasoning
        if self.alternatives:
            self.alternatives[self.chosen] = Reply(content, stats, interrupted, reasoning)

    def add_reply(self, reply: Reply) -> None:
        """Keep the replies so far and make ``reply`` the chosen one."""
        self.alternatives = self.replies() + [reply]
        self.choose(len(self.alternatives) - 1)

    def choose(self, index: int) -> None:
        replies = self.replies()
        self.chosen = max(0, min(index, len(replies) - 1))
        chosen = replies[self.chosen]
        self.content, self.stats, self.interrupted = chosen.content, chosen.stats, chosen.interrupted
        self.reasoning = chosen.reasoning

    def delete_chosen(self) -> None:
        """Drop the chosen reply (only when another one is left); its neighbour becomes the chosen one."""
        if len(self.alternatives) < 2:
            return
        del self.alternatives[self.chosen]
        self.choose(self.chosen)
        if len(self.alternatives) == 1:
            self.alternatives = []


@dataclass
class Conversation:
    """One chat: its title, system prompt and messages."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    system_prompt: str = ""
    messages: list[StoredMessage] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    context_used: int | None = None    # tokens its last request took with its reply (the context meter)

    @property
    def has_user_message(self) -> bool:
        """Whether the chat holds a message of the user's (something for Regenerate and Edit last)."""
        return any(m.role == "user" for m in self.messages)

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: object) -> "Conversation":
        """Parse a file's content; raises CorruptConversation naming the first field that is wrong."""
        if not isinstance(data, dict):
            raise CorruptConversation(f"the file holds {_kind(data)}, expected a conversation object")
        messages = _get(data, "messages", list, [], "messages")
        created = _loose(data, "created", (int, float), 0.0)
        return cls(id=_get(data, "id", str, "", "id"), title=_loose(data, "title", str, "Chat"),
                   system_prompt=_get(data, "system_prompt", str, "", "system_prompt"),
                   messages=[_message(m, f"messages[{i}]") for i, m in enumerate(messages)],
                   created=created, updated=_loose(data, "updated", (int, float), created),
                   context_used=_count(data, "context_used"))


def _kind(value: object) -> str:
    names = {str: "text", bool: "true/false", int: "a number", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _get(data: dict, key: str, kind: type | tuple, default: object, where: str) -> object:
    if key not in data:
        if default is None:
            raise CorruptConversation(f"{where} is missing")
        return default
    value = data[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        expected = {str: "text", bool: "true/false", list: "a list"}.get(kind, "a number")
        raise CorruptConversation(f"{where} is {_kind(value)}, expected {expected}")
    return value


def _loose(data: dict, key: str, kind: type | tuple, default: object) -> object:
    """A field the window only shows or sorts by (a title, times, a reply's summary line, flags): ``default``
    where it is missing or of another type, so that one stray value there never sets a chat aside."""
    value = data.get(key, default)
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        return default
    return value


def _count(data: dict, key: str) -> int | None:
    """A count the window only shows (no content of the chat's): a whole number of 0 or more, else
    None, so that a file with a stray value there still opens."""
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _reply(data: object, where: str) -> Reply:
    if not isinstance(data, dict):
        raise CorruptConversation(f"{where} is {_kind(data)}, expected an object")
    return Reply(_get(data, "content", str, "", f"{where}.content"), _loose(data, "stats", str, ""),
                 _loose(data, "interrupted", bool, False), _get(data, "reasoning", str, "", f"{where}.reasoning"))


def _message(data: object, where: str) -> StoredMessage:
    if not isinstance(data, dict):
        raise CorruptConversation(f"{where} is {_kind(data)}, expected an object")
    role = _get(data, "role", str, None, f"{where}.role")
    if role not in ROLES:
        raise CorruptConversation(f"{where}.role is {role!r}, expected one of {', '.join(ROLES)}")
    first = _reply(data, where)
    msg = StoredMessage(role, first.content, first.stats, first.interrupted, reasoning=first.reasoning)
    alternatives = _get(data, "alternatives", list, [], f"{where}.alternatives")
    if len(alternatives) > 1:
        msg.alternatives = [_reply(a, f"{where}.alternatives[{i}]") for i, a in enumerate(alternatives)]
        msg.choose(_loose(data, "chosen", int, 0))   # out of range: the nearest reply
    return msg


@dataclass(frozen=True)
class Loaded:
    """What ``load_all`` found: the conversations, and one line per file it could not use."""

    conversations: list[Conversation]
    problems: list[str]


def write_error_line(folder: Path, exc: OSError) -> str:
    """One line for a failed save: where, the system's reason, and what fixes it."""
    reason = exc.strerror or str(exc)
    elsewhere = "start Strata with XDG_DATA_HOME set to a folder you can write"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some disk space"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        fix = f"make {_nearest_existing(folder)} writable, or {elsewhere}"
    elif exc.errno == errno.EROFS:
        fix = f"the disk is read-only: {elsewhere}"
    elif exc.errno in (errno.ENOTDIR, errno.EEXIST):
        fix = f"a file is in the way: rename {_nearest_existing(folder)} or remove it"
    else:
        fix = elsewhere
    return (f"Conversations cannot be saved in {folder}: {reason}. To fix it, {fix}; "
            "until then this chat is kept in memory and saved at the next change.")


def _nearest_existing(folder: Path) -> Path:
    """``folder`` or its closest parent that exists (for a file in the way: that file)."""
    for path in (folder, *folder.parents):
        if path.exists():
            return path
    return folder


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ConversationStore:
    """Reads and writes conversations under ``folder`` (created on first save).

    ``write``, ``trash`` and ``restore`` may block on the disk: the chat calls them from its writer thread.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @property
    def trash_folder(self) -> Path:
        return self.folder / TRASH

    def path_of(self, conv_id: str) -> Path:
        return self.folder / f"{conv_id}.json"

    def set_aside_files(self, conv_id: str) -> list[Path]:
        """The damaged files of conversation ``conv_id`` that were renamed aside here, oldest first."""
        return sorted(self.folder.glob(f"{glob.escape(conv_id)}{CORRUPT_TAG}*.json"))

    def holds(self, conv_id: str) -> bool:
        """Whether a file of conversation ``conv_id`` is here, whether it could be read or not: its own,
        or one set aside as damaged. True when the folder cannot be looked into (nothing is known gone)."""
        try:
            return self.path_of(conv_id).exists() or bool(self.set_aside_files(conv_id))
        except OSError:
            return True

    def save(self, conv: Conversation) -> None:
        """Write ``conv`` now (raises OSError)."""
        self.write(conv.id, conv.to_json())

    def write(self, conv_id: str, data: dict) -> None:
        """Write ``data`` to a temporary file, fsync it, then rename it over the old file."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{conv_id}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path_of(conv_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)   # our own temporary copy; the old file is still whole
            raise
        _fsync_folder(self.folder)

    def trash(self, conv_id: str) -> None:
        """Move a conversation's file into the trash folder (where ``restore`` finds it)."""
        path = self.path_of(conv_id)
        if not path.exists():
            return
        self.trash_folder.mkdir(parents=True, exist_ok=True)
        os.replace(path, self.trash_folder / path.name)
        _fsync_folder(self.folder)

    def unwritable(self) -> str | None:
        """The line a save would fail with, where the folder (or the nearest one that exists) cannot be
        written now (read-only disk, permissions); None where a save may go through."""
        folder = self.folder if self.folder.exists() else _nearest_existing(self.folder)
        try:
            if os.statvfs(folder).f_flag & os.ST_RDONLY:
                return write_error_line(self.folder, OSError(errno.EROFS, "Read-only file system"))
        except (OSError, AttributeError):
            pass
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            return write_error_line(self.folder, OSError(errno.EACCES, "Permission denied"))
        return None

    def trashed(self) -> list[Conversation]:
        """The conversations in the trash folder that can be read, most recently updated first (a file
        that cannot be read stays there, untouched)."""
        out = []
        try:
            paths = sorted(self.trash_folder.glob("*.json"))
        except OSError:
            return []
        for path in paths:
            try:
                out.append(self._read(path))
            except (OSError, ValueError, NewerConversation):
                continue
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def restore(self, conv_id: str) -> None:
        """Move a conversation back from the trash (never over a file that is there)."""
        path = self.trash_folder / f"{conv_id}.json"
        if path.exists() and not self.path_of(conv_id).exists():
            os.replace(path, self.path_of(conv_id))
            _fsync_folder(self.folder)

    def load_all(self) -> Loaded:
        """Every conversation, most recently updated first; unreadable files are renamed aside and reported."""
        if not self.folder.exists():
            return Loaded([], [])
        if not self.folder.is_dir():
            exc = OSError(errno.ENOTDIR, "it is a file, not a folder")
            return Loaded([], [write_error_line(self.folder, exc)])
        out: list[Conversation] = []
        problems: list[str] = []
        self._sweep_temporaries()
        try:
            paths = sorted(p for p in self.folder.glob("*.json") if CORRUPT_TAG not in p.name)
        except OSError as exc:
            return Loaded([], [f"Conversations in {self.folder} cannot be read: {exc.strerror or exc}. "
                               f"To fix it, make the folder readable and restart Strata."])
        for path in paths:
            try:
                out.append(self._read(path))
            except OSError as exc:
                problems.append(f"Conversation file {path} cannot be read: {exc.strerror or exc}. "
                                "To fix it, make the file readable and restart Strata.")
            except NewerConversation as exc:
                problems.append(f"Conversation file {path.name} was written by a newer Strata (format {exc.args[0]}; "
                                f"this one reads up to {FORMAT_VERSION}); it was left as it is and not loaded. "
                                "To open it, use that newer version.")
            except (ValueError, CorruptConversation) as exc:
                problems.append(self._set_aside(path, str(exc)))
        return Loaded(sorted(out, key=lambda c: c.updated, reverse=True), problems)

    def _sweep_temporaries(self) -> None:
        """Remove this store's own temporary copies (``write``'s ``.<id>.*.tmp``) that a killed process
        left behind; the conversation file each was to replace is whole. Only those older than
        STALE_TMP_S: a younger one may be another running window's write in progress."""
        now = time.time()
        try:
            for tmp in self.folder.glob(".*.tmp"):
                if self._own_temporary(tmp.name) and tmp.is_file() and now - tmp.stat().st_mtime > STALE_TMP_S:
                    tmp.unlink(missing_ok=True)
        except OSError:
            pass                        # left for the next start: nothing depends on their removal

    def _own_temporary(self, name: str) -> bool:
        """Whether ``name`` is one of ``write``'s temporaries: ``.<id>.<8 random characters>.tmp`` for the id
        of a conversation file here or one this store makes. Any other hidden ``.tmp`` file is not ours."""
        found = _TEMPORARY.fullmatch(name)
        if found is None:
            return False
        conv_id = found.group(1)
        return bool(_NEW_ID.fullmatch(conv_id)) or self.path_of(conv_id).is_file()

    def _read(self, path: Path) -> Conversation:
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise CorruptConversation("it is not UTF-8 text") from exc
        except json.JSONDecodeError as exc:
            raise CorruptConversation(f"it is not valid JSON (line {exc.lineno}, column {exc.colno})") from exc
        version = data.get("version") if isinstance(data, dict) else None
        if type(version) is int and version > FORMAT_VERSION:
            raise NewerConversation(version)
        conv = Conversation.from_json(data)
        conv.id = path.stem    # the file name is the id every later save writes to
        return conv

    def _set_aside(self, path: Path, reason: str) -> str:
        """Rename a file that is not a conversation, so it is kept but never read again; returns the line."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.stem}{CORRUPT_TAG}{stamp}.json")
        n = 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.stem}{CORRUPT_TAG}{stamp}-{n}.json")
        try:
            os.replace(path, aside)
        except OSError as exc:
            return (f"Conversation file {path} is damaged ({reason}) and could not be renamed aside "
                    f"({exc.strerror or exc}); it was left as it is and not loaded.")
        return (f"Conversation file {path.name} is damaged ({reason}); it was kept as {aside.name} in "
                f"{self.folder} and the other conversations were loaded.")
