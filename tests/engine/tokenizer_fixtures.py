"""A tiny byte-level BPE tokenizer with a Qwen-style chat template, written into a model folder.

Tests that need a real tokenizer (or a tiny model) call :func:`build_tiny_tokenizer` on a tmp folder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS = "<|startoftext|>"
PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS, IM_START, IM_END)

TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog.",
    "Mixture-of-experts models route every token to a few experts.",
    "Hello world! How are you today? I am fine, thank you.",
    "The expert pool keeps hot experts on the GPU and streams cold ones over PCIe.",
    "你好，世界！今天天气很好。专家模型在显卡上运行。",
    "こんにちは、世界。東京は晴れです。",
    "Emoji: 😀 🚀 🎉 👍🏽 ❤️ and the flag 🇯🇵.",
    "def add(a, b):\n    return a + b\n",
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


@dataclass(frozen=True)
class TinyTokenizerInfo:
    """Ids of the tiny tokenizer's special tokens and its total vocabulary size."""

    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    im_start_id: int


def build_tiny_tokenizer(path: str | Path, vocab_size: int = 384, add_bos_token: bool = False,
                         chat_template: str | None = CHAT_TEMPLATE) -> TinyTokenizerInfo:
    """Train a byte-level BPE on a few sentences and save ``tokenizer.json`` + ``tokenizer_config.json``.

    Every byte has a token, so any text (CJK, emoji) encodes. Special ids: ``<|endoftext|>`` (pad) = 0,
    ``<|startoftext|>`` (bos) = 1, ``<|im_start|>`` = 2, ``<|im_end|>`` (eos) = 3.
    """
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        # eos in the AddedToken dict form real checkpoints use; the loaders must accept both forms.
        "eos_token": {"__type": "AddedToken", "content": IM_END, "special": True, "lstrip": False,
                      "rstrip": False, "normalized": False, "single_word": False},
        "pad_token": PAD,
        "add_bos_token": add_bos_token,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    return TinyTokenizerInfo(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), bos_token_id=ids[BOS],
        eos_token_id=ids[IM_END], pad_token_id=ids[PAD], im_start_id=ids[IM_START],
    )
