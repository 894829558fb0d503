"""Markdown text as the HTML a message bubble shows: each line break kept as written, block quotes marked."""
from __future__ import annotations

import functools
import re

from PySide6.QtGui import QColor, QFontDatabase, QFontInfo, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

_BODY_STYLE = re.compile(r"<body style=\"[^\"]*\">")
_UNDERLINE = 0x4000           # the reader's flag that takes _x_ and __x__ for underlines (md4c's MD_FLAG_UNDERLINE)
# GitHub's dialect as GitHub reads it: _x_ in italics and __x__ in bold (Qt's reads them as underlines, which
# look like links), and any HTML in the text kept as text
_MARKDOWN = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value & ~_UNDERLINE
    | QTextDocument.MarkdownFeature.MarkdownNoHTML.value)
_QUOTES = re.compile(r"(?:[ ]{0,3}>[ ]?)*")                  # the ">" markers of a block quote, any depth
_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})(.*)")               # ``` or ~~~ (or longer), then an info string
_ENDS_BLOCK = re.compile(r" {0,3}(#{1,6}(\s|$)|([-*_])( *\3){2,} *$|=+ *$)")    # a heading, a rule, an underline
_LINE_BREAK = "\u2028"                                        # a line break inside a paragraph (<br>)


def _opens_fence(content: str) -> str:
    """The fence a line opens a code block with ("" if none): info after backticks has no backtick."""
    m = _FENCE.fullmatch(content)
    return m.group(1) if m and not (m.group(1)[0] == "`" and "`" in m.group(2)) else ""


def _closes_fence(content: str, fence: str) -> bool:
    m = _FENCE.fullmatch(content)
    return bool(m) and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip()


def _with_breaks(text: str, joined: bool = False) -> str:
    """``text`` with a hard break (two spaces) at the end of each line that goes on in the next line, or with
    none (``joined``: the lines of a paragraph read as one); lines of code (fenced or indented) stay as written."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    fence, depth, code = "", 0, True          # the open fence and its quote depth; whether an indented line is code
    for i, line in enumerate(lines):
        quotes = _QUOTES.match(line).group()
        content, level = line[len(quotes):], quotes.count(">")
        inside = fence and re.match(r"(?:[ ]{0,3}>[ ]?){%d}" % depth, line)
        if inside:                            # a fenced code block, until its closing fence or the end of its quote
            fence, code = ("", True) if _closes_fence(line[inside.end():], fence) else (fence, code)
            continue
        indented = content.startswith(("    ", "\t")) or content.startswith(" ") and "\t" in content[:4]
        if indented and code or not content.strip():
            code = True                       # indented code can only follow a blank line or more of it
            continue
        # after a heading or a rule (a setext heading's underline too) a new block starts: indented is code
        code, fence, depth = bool(_ENDS_BLOCK.match(content)), _opens_fence(content), level
        if fence or i + 1 == len(lines) or not lines[i + 1].strip():
            continue
        broken = (len(line) - len(line.rstrip("\\"))) % 2       # ends in a backslash: a line break already
        if joined:
            lines[i] = (line[:-1] if broken else line).rstrip(" ")
        elif not broken:
            lines[i] = line.rstrip(" ") + "  "
    return "\n".join(lines)


def hard_breaks(text: str) -> str:
    """Each line break inside a paragraph kept as one (Markdown would join the lines into one): a poem, an
    address or a log reads as it was written. Not in a code block, where the added spaces would be copied."""
    return _with_breaks(text)


def _join_broken_lines(doc: QTextDocument, joined: QTextDocument) -> None:
    """The lines of one paragraph put back into one block with line breaks between them: Qt's Markdown reader
    starts a new block (with a paragraph's margins) at each hard break. ``joined`` is the same text read with
    its lines joined, which shows which blocks are one paragraph; where the two do not line up nothing changes."""
    whole = [b.text() for b in _blocks(joined)]
    goes_on, rest, at = [], "", -1
    for block in _blocks(doc):
        text = block.text()
        if rest.strip():                      # the paragraph goes on: this line came after a hard break
            rest = rest.lstrip()
            goes_on.append(block.blockNumber())
        else:
            at += 1
            rest = whole[at] if at < len(whole) else None
        if rest is None or not rest.startswith(text):
            return
        rest = rest[len(text):]
    edit = QTextCursor(doc)
    edit.beginEditBlock()          # one edit for them all: the document is laid out once, not once a line
    for number in reversed(goes_on):
        cursor = QTextCursor(doc.findBlockByNumber(number))
        cursor.deletePreviousChar()
        cursor.insertText(_LINE_BREAK, QTextCharFormat())       # not part of a link that ends the line
    edit.endEditBlock()


def _blocks(doc: QTextDocument):
    block = doc.begin()
    while block.isValid():
        yield block
        block = block.next()


QUOTE_BAR = "\u258e"         # a quoted line starts with one per level: a label draws a quote's indent only,
QUOTE_COLOR = "#8b949e"      # which read as the list above it going on


def _mark_quotes(doc: QTextDocument) -> None:
    """Each line of a block quote marked as one: a bar per level, and dimmed."""
    dim = QTextCharFormat()
    dim.setForeground(QColor(QUOTE_COLOR))
    edit = QTextCursor(doc)
    edit.beginEditBlock()          # one edit for them all, as in _join_broken_lines
    for block in _blocks(doc):
        level = block.blockFormat().intProperty(QTextFormat.Property.BlockQuoteLevel)
        if level:
            starts = [0] + [i + 1 for i, c in enumerate(block.text()) if c == _LINE_BREAK]
            cursor = QTextCursor(block)
            for start in reversed(starts):
                cursor.setPosition(block.position() + start)
                cursor.insertText(QUOTE_BAR * level + " ")
            cursor.movePosition(QTextCursor.MoveOperation.StartOfBlock)
            cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(dim)
    edit.endEditBlock()


# inline code as Qt writes it: a generic family a label's rich text takes for a font of that name, not for
# the fixed-pitch one (`code` showed in the text's own font); the code boxes' font, by the name it resolves to
_CODE_FAMILY = "font-family:'monospace';"


@functools.cache
def _code_family() -> str:
    return QFontInfo(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)).family().replace("'", "")


def markdown_html(text: str) -> str:
    """Markdown as the HTML a label shows, line breaks kept (as close together as in one paragraph), with any
    HTML in the text kept as the characters it is made of (``vector<int>``, ``<think>``, ``<span style=...>``
    stay text; a label's own Markdown would take them as tags and hide or style them)."""
    doc, joined = QTextDocument(), QTextDocument()
    doc.setMarkdown(hard_breaks(text), _MARKDOWN)
    joined.setMarkdown(_with_breaks(text, joined=True), _MARKDOWN)
    _join_broken_lines(doc, joined)
    _mark_quotes(doc)
    # the document's default font would be written into the body: the label's own font is the one to use
    html = _BODY_STYLE.sub("<body>", doc.toHtml(), count=1)
    return html.replace(_CODE_FAMILY, f"font-family:'{_code_family()}','monospace';") if _CODE_FAMILY in html else html
