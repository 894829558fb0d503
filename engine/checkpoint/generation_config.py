"""The token ids and generation defaults a model folder declares: ``bos/eos/pad_token_id`` in ``config.json``
and ``generation_config.json`` (the tokenizer stops generation at these eos ids), checked for type and range
like every other field the loader reads: one line naming the file, the field, what was found and what is
expected."""
from __future__ import annotations

import json
import math
from pathlib import Path

from engine.checkpoint.config_fields import ConfigFields
from engine.checkpoint.reader import cannot_read
from engine.errors import ModelLoadError

TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")

# generation_config.json's sampling defaults: (what a value must be, its test); transformers' GenerationConfig
# reads null as "unset" for every field, so null passes
SAMPLING_FIELDS = {
    "temperature": ("a number >= 0", lambda v: v >= 0),
    "top_p": ("a number from 0 to 1", lambda v: 0 <= v <= 1),
    "min_p": ("a number from 0 to 1", lambda v: 0 <= v <= 1),
    "repetition_penalty": ("a number above 0", lambda v: v > 0),
}
COUNT_FIELDS = {"top_k": 0, "max_new_tokens": 1, "max_length": 1}      # integer fields and their least value
GENERATION_NULLS = frozenset({*TOKEN_ID_KEYS, *SAMPLING_FIELDS, *COUNT_FIELDS, "do_sample"})


def check_token_ids(f: ConfigFields, vocab_size: int) -> None:
    """``bos/eos/pad_token_id`` of ``f`` are null, a token id or a list of them, each below ``vocab_size``."""
    for key in (k for k in TOKEN_ID_KEYS if f.given(k)):
        value = f.cfg[key]
        if key == "pad_token_id" and value == -1 and not isinstance(value, bool):
            continue         # older configs write -1 for "no padding token": nothing reads it as an id
        # whole JSON integers only: the tokenizer reads nothing else as an id (3.0 would be dropped unsaid)
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size
               for i in (value if isinstance(value, list) else [value])):
            raise f.bad(key, value, f"a token id from 0 to {vocab_size - 1} (below vocab_size) or a list of them")


def check_generation_config(folder: Path, vocab_size: int) -> None:
    """Check ``generation_config.json`` of a model folder, when there is one (it is optional)."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise cannot_read(path, e, "check the disk it is on, or restore the file from the original "
                                   "checkpoint") from None
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); restore the file from the original checkpoint") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object; restore the file from the original checkpoint")
    f = ConfigFields(cfg, path, nulls=GENERATION_NULLS)
    check_token_ids(f, vocab_size)
    for key, (expected, fits) in SAMPLING_FIELDS.items():
        value = cfg.get(key)
        number = value is not None and not isinstance(value, bool) and isinstance(value, (int, float))
        if value is not None and not (number and math.isfinite(value) and fits(value)):
            raise f.bad(key, value, expected)
    for key, least in COUNT_FIELDS.items():
        if f.given(key):
            f.integer(key, minimum=least)
    f.flag("do_sample", False)
