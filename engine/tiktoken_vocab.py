"""A tiktoken vocabulary (``tiktoken.model``) read as a ``tokenizers`` byte-level BPE, so that models that ship
one instead of ``tokenizer.json`` (Moonlight, Kimi K2: DeepSeek-V3's architecture) run through the same
tokenizer as every other model.

What such a folder holds, and how each part is read:

- ``tiktoken.model``: one line per token, ``<base64 of its bytes> <rank>``; ranks are ids, 0 to N - 1.
- the pre-tokenising regex: the ``pat_str`` the folder's tokenizer module assigns (``tokenization_*.py``,
  the one ``tokenizer_config.json``'s ``auto_map`` names, else the only one). The module is parsed, never
  run: the value must be a string literal, literals joined by ``+`` or ``"sep".join([...])`` of literals.
  Its ``num_reserved_special_tokens`` (an int literal) sizes the special ids, as the module does.
- special tokens: ids N to N + reserved + 1, named by ``tokenizer_config.json``'s ``added_tokens_decoder``
  where it names them, else ``<|reserved_token_{id}|>``.

The BPE: tiktoken merges, at each step, the adjacent pair whose joined bytes have the lowest rank, and
takes a piece that is one token whole. The same result comes from BPE merges ordered by the rank of
what they make (every split of every token into two tokens, so that any adjacent pair tiktoken could
join is a merge here) and ``ignore_merges`` (a piece in the vocabulary is one token).
"""
from __future__ import annotations

import ast
import base64
import binascii
import functools
import json
from pathlib import Path

from tokenizers import Tokenizer

from engine.errors import ModelLoadError

VOCAB_FILE = "tiktoken.model"
MAX_SPECIAL = 1 << 17                # special tokens past the BPE ones: far more than any release has
_REFETCH = "restore it from the original checkpoint"


@functools.cache
def byte_chars() -> tuple[str, ...]:
    """The byte-level alphabet: byte b as the printable character byte-level BPE vocabularies spell it
    (printable Latin-1 bytes as themselves, the others as 256 + their order among them)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


def _spell(token: bytes) -> str:
    table = byte_chars()
    return "".join(table[b] for b in token)


def read_ranks(path: Path) -> dict[bytes, int]:
    """``tiktoken.model``'s tokens and their ranks, checked: every line two fields, ranks 0 to N - 1 once each."""
    ranks: dict[bytes, int] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ModelLoadError(f"{path} could not be read ({exc.strerror}); {_REFETCH}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            raise ModelLoadError(f"{path}: line {n} is not '<base64 token> <rank>'; {_REFETCH}") from None
        if token in ranks or not token:
            raise ModelLoadError(f"{path}: line {n} repeats a token or gives an empty one; {_REFETCH}")
        ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ModelLoadError(f"{path}: the ranks are not 0 to {len(ranks) - 1}, each once; {_REFETCH}")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ModelLoadError(f"{path}: {len(missing)} of the 256 single bytes have no token (byte {missing[0]} first), "
                             f"so some text could not be encoded; {_REFETCH}")
    return ranks


def _literal(node: ast.AST) -> str | int | None:
    """A string or int literal, literals joined by ``+``, or ``"sep".join([...])`` of literals; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return a + b if isinstance(a, str) and isinstance(b, str) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep, items = _literal(node.func.value), [_literal(e) for e in node.args[0].elts]
        if isinstance(sep, str) and all(isinstance(i, str) for i in items):
            return sep.join(items)           # type: ignore[arg-type]
    return None


def _assigned(tree: ast.Module, name: str) -> ast.AST | None:
    """The value last assigned to ``name`` at module or class level (where tokenizer modules set it)."""
    found = None
    bodies = [tree.body] + [n.body for n in tree.body if isinstance(n, ast.ClassDef)]
    for body in bodies:
        for stmt in body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                found = stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name \
                    and stmt.value is not None:
                found = stmt.value
    return found


def _tokenizer_module(folder: Path, cfg: dict) -> Path:
    """The folder's tokenizer module: the one ``auto_map`` names, else the only ``tokenization_*.py``."""
    auto = cfg.get("auto_map", {}).get("AutoTokenizer") if isinstance(cfg.get("auto_map"), dict) else None
    names = [a for a in (auto if isinstance(auto, list) else [auto]) if isinstance(a, str)]
    for name in names:
        module = name.split("--")[-1].rsplit(".", 1)[0]       # "repo--tokenization_x.Class" or "tokenization_x.Class"
        if not module.isidentifier():                         # a module of this folder, named plainly
            continue
        path = folder / f"{module}.py"
        if path.is_file():
            return path
    found = sorted(folder.glob("tokenization*.py"))
    if len(found) == 1:
        return found[0]
    what = "no tokenization_*.py" if not found else f"{len(found)} tokenization_*.py files and no auto_map naming one"
    raise ModelLoadError(f"{folder} ships {VOCAB_FILE} but {what}, so its pre-tokenising pattern (pat_str) is "
                         f"unknown; copy the tokenizer module (tokenization_*.py) from the original checkpoint")


def _module_settings(path: Path) -> tuple[str, int]:
    """``pat_str`` and ``num_reserved_special_tokens`` (256 when not set) of a tokenizer module, read without
    running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise ModelLoadError(f"{path} could not be read as Python ({exc}); {_REFETCH}") from exc
    node = _assigned(tree, "pat_str")
    pattern = _literal(node) if node is not None else None
    if not isinstance(pattern, str) or not pattern:
        why = "assigns no pat_str" if node is None else "builds pat_str from more than literal strings"
        raise ModelLoadError(f"{path} {why}, so the vocabulary's pre-tokenising pattern is unknown; restore the "
                             "file from the original checkpoint")
    node = _assigned(tree, "num_reserved_special_tokens")
    reserved = _literal(node) if node is not None else 256
    if not isinstance(reserved, int) or not 0 <= reserved <= 1 << 16:
        raise ModelLoadError(f"{path}: num_reserved_special_tokens is not an integer literal from 0 to 65536; "
                             f"{_REFETCH}")
    return pattern, reserved


def _special_tokens(cfg: dict, first: int, reserved: int) -> list[dict]:
    """The special tokens after the ``first`` BPE id, as tokenizer.json's added tokens, in id order."""
    named: dict[int, str] = {}
    decoder = cfg.get("added_tokens_decoder")
    for key, entry in (decoder.items() if isinstance(decoder, dict) else ()):
        content = entry.get("content") if isinstance(entry, dict) else None
        if isinstance(content, str) and str(key).isascii() and str(key).isdigit():
            named[int(key)] = content
    end = max([first + reserved + 2, *(i + 1 for i in named if i >= first)])
    if end - first > MAX_SPECIAL:
        raise ModelLoadError(f"tokenizer_config.json: added_tokens_decoder names token {end - 1}, {end - first} past "
                             f"the {first} of {VOCAB_FILE}; no vocabulary has that many special tokens; {_REFETCH}")
    return [{"id": i, "content": named.get(i, f"<|reserved_token_{i}|>"), "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True} for i in range(first, end)]


def tiktoken_backend(folder: Path, cfg: dict) -> Tokenizer:
    """The ``tokenizers`` tokenizer of a folder that ships ``tiktoken.model`` (see the module docstring);
    ``cfg``: its parsed ``tokenizer_config.json`` ({} when it has none)."""
    ranks = read_ranks(folder / VOCAB_FILE)
    pattern, reserved = _module_settings(_tokenizer_module(folder, cfg))
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            a, b = token[:i], token[i:]
            if a in ranks and b in ranks:
                merges.append((rank, ranks[a], ranks[b], a, b))
    merges.sort()
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _special_tokens(cfg, len(ranks), reserved),
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {_spell(t): r for t, r in ranks.items()},
                  "merges": [[_spell(a), _spell(b)] for *_, a, b in merges]},
    }
    try:
        return Tokenizer.from_str(json.dumps(spec))
    except Exception as exc:       # the Rust library raises plain Exceptions (e.g. a regex it cannot compile)
        raise ModelLoadError(f"{folder}: the tiktoken vocabulary could not be built ({exc}); restore "
                             f"{VOCAB_FILE} and the tokenizer module from the original checkpoint") from exc
