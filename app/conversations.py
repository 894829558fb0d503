"""Conversations on disk: one JSON file each, written atomically so a crash never loses one."""
from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1


@dataclass
class StoredMessage:
    role: str                      # "user" | "assistant"
    content: str
    stats: str = ""                # the per-reply summary line (assistant messages)


@dataclass
class Conversation:
    """One chat: its title, system prompt and messages."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    system_prompt: str = ""
    messages: list[StoredMessage] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> "Conversation":
        msgs = [StoredMessage(**{k: m.get(k, "") for k in ("role", "content", "stats")})
                for m in data.get("messages", []) if isinstance(m, dict)]
        return cls(id=str(data["id"]), title=str(data.get("title", "Chat")),
                   system_prompt=str(data.get("system_prompt", "")), messages=msgs,
                   created=float(data.get("created", 0.0)), updated=float(data.get("updated", 0.0)))


class ConversationStore:
    """Reads and writes conversations under ``folder`` (created on first save)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path_of(self, conv_id: str) -> Path:
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        """Write ``conv`` to a temporary file, then rename it over the old one."""
        self.folder.mkdir(parents=True, exist_ok=True)
        conv.updated = time.time()
        fd, tmp = tempfile.mkstemp(prefix=f".{conv.id}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                # no fsync: it can block the GUI for tens of ms; the rename alone keeps the file whole
                json.dump(conv.to_json(), f, ensure_ascii=False, indent=1)
            os.replace(tmp, self.path_of(conv.id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first (unreadable files are skipped)."""
        if not self.folder.is_dir():
            return []
        out = []
        for path in self.folder.glob("*.json"):
            try:
                out.append(Conversation.from_json(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def delete(self, conv_id: str) -> None:
        self.path_of(conv_id).unlink(missing_ok=True)
