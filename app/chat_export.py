"""A chat written out for the user to keep or share: Markdown to read, or the conversation file's JSON."""
from __future__ import annotations

import json
import re
from pathlib import Path

from app.conversations import Conversation
from app.export_file import write_export
from app.markdown_text import hard_breaks


_HEADING = re.compile(r"^( {0,3})(#{1,6})(?=\s|$)")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _nested(text: str) -> str:
    """``text``'s Markdown headings two levels down (at most ``######``), so that a message's own "## Plan"
    sits under its speaker's "## You" instead of reading as another speaker; code blocks stay as written."""
    out, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
            fence = m.group(1) if fence is None else None
        elif fence is None:
            line = _HEADING.sub(lambda h: h.group(1) + "#" * min(6, len(h.group(2)) + 2), line)
        out.append(line)
    return "\n".join(out)


def chat_markdown(conv: Conversation) -> str:
    """The chat as Markdown: its title, the system prompt, then each message under its speaker; a reply's
    reasoning as a quote above it, and the line under a reply (its stats, or that it was cut short). Line
    breaks inside a paragraph are kept as the workbench shows them (hard breaks; code stays as written)."""
    out = [f"# {conv.title}", ""]
    if conv.system_prompt.strip():
        out += ["**System prompt**", "", hard_breaks(conv.system_prompt), ""]
    for m in conv.messages:
        out += ["## You" if m.role == "user" else "## Assistant", ""]
        if m.reasoning:
            out += [hard_breaks("\n".join("> " + line for line in m.reasoning.splitlines())) or ">", ""]
        out += [hard_breaks(_nested(m.content)), ""]
        note = "interrupted" if m.interrupted else m.stats
        if m.role == "assistant" and note:
            out += [f"*{note}*", ""]
    return "\n".join(out).rstrip() + "\n"


def export_chat(conv: Conversation, path: str | Path) -> Path:
    """Write ``conv`` to ``path`` (raises OSError, leaving nothing behind): JSON for a ``.json`` name, else
    Markdown (``.md`` added to a name without an extension). Returns the path written."""
    path = Path(path)
    if not path.suffix and not path.is_dir():
        path = path.with_suffix(".md")
    text = (json.dumps(conv.to_json(), ensure_ascii=False, indent=1) if path.suffix.lower() == ".json"
            else chat_markdown(conv))
    write_export(path, lambda f: f.write(text))
    return path
