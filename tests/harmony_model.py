"""Tiny harmony (gpt-oss chat format) tokenizers and models for tests: the byte-level tiny vocabulary plus
harmony's special tokens, and a harmony chat template that renders what openai-harmony renders."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")

HARMONY_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1, instructions='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif -%}"
    "{%- if m.role == 'system' or m.role == 'developer' -%}"
    "{%- set ns.instructions = ns.instructions + ('\\n\\n' if ns.instructions else '') + m.content -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: {{ strftime_now('%Y-%m-%d') }}\n\n"
    "Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "{%- if tools %}{{ '\\n' }}Calls to these tools must go to the commentary channel: 'functions'.{% endif -%}"
    "<|end|>"
    "{%- if ns.instructions or tools -%}"
    "<|start|>developer<|message|>"
    "{%- if ns.instructions %}# Instructions\n\n{{ ns.instructions }}{% endif -%}"
    "{%- if tools -%}"
    "{%- if ns.instructions %}{{ '\\n\\n' }}{% endif %}# Tools\n\n## functions\n\nnamespace functions {{ '{' }}{{ '\\n\\n' }}"
    "{%- for t in tools %}// {{ t.function.description }}\ntype {{ t.function.name }} = "
    "(_: {{ t.function.parameters | tojson }}) => any;\n\n{% endfor %}} // namespace functions"
    "{%- endif -%}"
    "<|end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}"
    "{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif -%}"
    "{%- for c in m.tool_calls or [] -%}"
    "<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary <|constrain|>json<|message|>"
    "{{ c.function.arguments if c.function.arguments is string else (c.function.arguments | tojson) }}<|call|>"
    "{%- endfor -%}"
    "{%- if m.content or not (m.thinking or m.tool_calls) -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content or '' }}<|end|>{% endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif -%}"
)


def make_harmony_tokenizer(folder: Path, vocab: int = 512) -> Path:
    """Turn the tiny tokenizer in ``folder`` into a harmony one: the special tokens, the template, and
    ``<|return|>`` / ``<|call|>`` as the ids generation stops at."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_TOKENS])
    if tok.get_vocab_size(with_added_tokens=True) > vocab:
        raise ValueError(f"the tiny tokenizer outgrew the model's {vocab} embeddings")
    tok.save(str(folder / "tokenizer.json"))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update(chat_template=HARMONY_TEMPLATE, eos_token="<|return|>")
    cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    stops = [tok.token_to_id("<|return|>"), tok.token_to_id("<|call|>")]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}), encoding="utf-8")
    return folder


def build_tiny_harmony_tokenizer(folder: Path) -> Path:
    from tests.engine.tokenizer_fixtures import build_tiny_tokenizer
    build_tiny_tokenizer(folder, vocab_size=500, chat_template=None)
    return make_harmony_tokenizer(folder)


def build_tiny_harmony_model(folder: Path, context: int = 2048) -> Path:
    """A tiny random MoE model (qwen3_moe weights) that speaks harmony."""
    from tests.tiny_models import build_tiny_model

    from tests.engine.tokenizer_fixtures import build_tiny_tokenizer
    build_tiny_model(folder, "qwen3_moe")
    build_tiny_tokenizer(folder, vocab_size=500, chat_template=None)     # room for harmony's tokens
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = context
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return make_harmony_tokenizer(folder)
