"""Typed reads of a parsed ``config.json`` object, each bad value one line naming the file, the field,
what was found and what was expected (:class:`ConfigFields`)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from engine.errors import ModelLoadError

_REQUIRED = object()

# config.json fields whose null transformers reads as "use the default" (its config classes and RoPE code put
# the default in, or give null that meaning): null there is the field left out. Any other null is refused
# like any other wrong type, since transformers refuses it too or builds a broken model from it.
_YARN_DEFAULTS = ("factor", "attention_factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow")
CONFIG_NULLS = frozenset({
    "architectures", "head_dim", "num_key_value_heads", "mlp_only_layers", "layer_types", "sliding_window",
    "rope_parameters", "rope_scaling", "partial_rotary_factor", "original_max_position_embeddings",
    "quantization_config", "quantization_config.weight_block_size", "dtype", "torch_dtype", "clip_qkv",
    "q_lora_rank", "bos_token_id", "eos_token_id", "pad_token_id",
    *(f"{rope}.{key}" for rope in ("rope_parameters", "rope_scaling") for key in _YARN_DEFAULTS)})


def _show(value: object) -> str:
    """A value as it reads in the JSON file, cut short if long."""
    text = json.dumps(value)
    return text if len(text) <= 48 else text[:45] + "..."


def as_int(value: object) -> int | None:
    """``value`` as an int when it is one (6 or 6.0), else None (bools, strings, 6.5 are not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class ConfigFields:
    """Typed reads of one parsed JSON object. ``null`` counts as "not given" for the fields in ``nulls``
    (those whose null transformers reads as the default) and is refused for the rest.

    Each reader checks one kind of value and raises a one-line ModelLoadError on a bad one.
    """

    def __init__(self, cfg: dict, file: Path, prefix: str = "", nulls: frozenset[str] = CONFIG_NULLS) -> None:
        self.cfg, self.file, self.prefix, self.nulls = cfg, file, prefix, nulls

    def given(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def null(self, key: str) -> bool:
        """``key`` is null where null does not mean the default: its reader refuses it."""
        return key in self.cfg and self.cfg[key] is None and f"{self.prefix}{key}" not in self.nulls

    def first_given(self, *keys: str) -> str:
        """The first of ``keys`` that is given (else the first one written, null or not, else the first),
        for fields with several spellings."""
        return next((k for k in keys if self.given(k)), next((k for k in keys if k in self.cfg), keys[0]))

    def show(self) -> str:
        """The object as it reads in the JSON file, cut short if long."""
        return _show(self.cfg)

    def bad(self, key: str, found: object, expected: str) -> ModelLoadError:
        return ModelLoadError(f"{self.file}: field '{self.prefix}{key}' is {_show(found)} but must be {expected}; "
                              f"correct it or restore {self.file.name} from the original checkpoint")

    def _get(self, key: str, default: object) -> object:
        if self.given(key):
            return self.cfg[key]
        if self.null(key) or (default is _REQUIRED and key in self.cfg):
            return None          # null where a value is needed: the reader's type check names it
        if default is not _REQUIRED:
            return default
        raise ModelLoadError(f"{self.file}: field '{self.prefix}{key}' is missing from {self.file.name}; the file is "
                             "incomplete or not a Hugging Face causal-LM config")

    def integer(self, key: str, default: object = _REQUIRED, minimum: int = 1, maximum: int | None = None,
                why: str = "") -> int:
        value = self._get(key, default)
        n = as_int(value)
        if n is None or n < minimum or (maximum is not None and n > maximum):
            if maximum is not None:
                expected = f"an integer from {minimum} to {maximum}"
            else:
                expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.bad(key, value, expected + (f" ({why})" if why else ""))
        return n

    def number(self, key: str, default: float | None, maximum: float | None = None, why: str = "") -> float | None:
        """A finite number above zero (epsilons, rope theta, clip bounds), at most ``maximum`` if given."""
        value = self._get(key, default)
        if value is None and not self.null(key):
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
                or (maximum is not None and value > maximum)):
            expected = "a finite number above 0" + (f" and at most {maximum:g}" if maximum is not None else "")
            raise self.bad(key, value, expected + (f" ({why})" if why else ""))
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if value is True or value is False:
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise self.bad(key, value, "true or false")

    def text(self, key: str, default: str) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.bad(key, value, "a string")
        return value

    def choice(self, key: str, allowed: dict[str, str], default: str) -> str:
        """A string among ``allowed``'s keys, returned in its canonical spelling (``allowed``'s value)."""
        value = self._get(key, default)
        if not isinstance(value, str) or value not in allowed:
            raise self.bad(key, value, "one of " + ", ".join(sorted(set(allowed.values()))))
        return allowed[value]

    def int_list(self, key: str, minimum: int, maximum: int) -> tuple[int, ...]:
        value = self._get(key, [])
        items = [as_int(v) for v in value] if isinstance(value, list) else [None]
        if any(n is None or not minimum <= n <= maximum for n in items):
            raise self.bad(key, value, f"a list of integers from {minimum} to {maximum}")
        return tuple(n for n in items if n is not None)

    def str_list(self, key: str, example: str) -> tuple[str, ...]:
        value = self._get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.bad(key, value, f'a list of strings such as ["{example}"]')
        return tuple(value)

    def nested(self, key: str, example: str) -> "ConfigFields | None":
        """The JSON object at ``key`` (None when not given), read with the same checks."""
        value = self._get(key, None)
        if value is None and not self.null(key):
            return None
        if not isinstance(value, dict):
            or_null = " (or null)" if f"{self.prefix}{key}" in self.nulls else ""
            raise self.bad(key, value, f"an object such as {example}{or_null}")
        return ConfigFields(value, self.file, f"{self.prefix}{key}.", self.nulls)
