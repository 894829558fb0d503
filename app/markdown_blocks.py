"""Split streamed Markdown into finished blocks and the unfinished tail.

A paragraph is finished at a blank line; a fenced code block at its closing fence. Finished blocks
are rendered once; only the tail is redrawn (as plain text) while the reply streams.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^(```|~~~)\s*([\w+#.-]*)\s*$")


@dataclass(frozen=True)
class Block:
    kind: str          # "markdown" | "code"
    text: str          # markdown source, or the code without its fences
    lang: str = ""


def split_finished(text: str) -> tuple[list[Block], str]:
    """``text`` -> (finished blocks, unfinished tail); feed the tail back with more text later."""
    blocks: list[Block] = []
    lines = text.split("\n")
    complete_lines = lines[:-1]   # the last element has no newline yet
    start = 0
    i = 0
    para: list[str] = []
    while i < len(complete_lines):
        fence = _FENCE.match(complete_lines[i].strip())
        if fence:
            close = next((j for j in range(i + 1, len(complete_lines))
                          if complete_lines[j].strip() == fence.group(1)), None)
            if close is None:
                break
            if para:
                blocks.append(Block("markdown", "\n".join(para)))
                para = []
            blocks.append(Block("code", "\n".join(complete_lines[i + 1:close]), fence.group(2)))
            i = start = close + 1
            continue
        if complete_lines[i].strip() == "":
            if para:
                blocks.append(Block("markdown", "\n".join(para)))
                para = []
            start = i + 1
        else:
            para.append(complete_lines[i])
        i += 1
    return blocks, "\n".join(lines[start:])


def split_all(text: str) -> list[Block]:
    """Every block of a finished reply (the tail becomes the last block)."""
    blocks, tail = split_finished(text)
    lines = tail.split("\n")
    at = next((i for i, line in enumerate(lines) if _FENCE.match(line.strip())), None)
    prose = "\n".join(lines if at is None else lines[:at]).strip()
    if prose:
        blocks.append(Block("markdown", prose))
    if at is not None:   # a code block the reply never closed
        body = "\n".join(lines[at + 1:]).rstrip("`~ \n")
        blocks.append(Block("code", body, _FENCE.match(lines[at].strip()).group(2)))
    return blocks
