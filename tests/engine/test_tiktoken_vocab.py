"""A model folder that ships a tiktoken vocabulary (``tiktoken.model`` and a tokenizer module holding its
pattern, as Moonlight and Kimi K2 do) instead of tokenizer.json: its ids are tiktoken's own for every text
(the ``tiktoken`` library is the reference), specials included; it decodes, streams and chats; a folder
missing a part is one line naming it."""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from engine.errors import ModelLoadError
from engine.tiktoken_vocab import byte_chars
from engine.tokenizer import Tokenizer
from main import main

tiktoken = pytest.importorskip("tiktoken")

DEMO = Path(__file__).resolve().parents[2] / "resources" / "models" / "demo"
RESERVED = 6
# a pattern in the style of these modules: Han runs apart, letters with class intersections, case-folded
# contractions, digits in threes, punctuation runs, newlines and spaces
MODULE = '''
import tiktoken


class TikTokenTokenizer:
    num_reserved_special_tokens = %d
    pat_str = "|".join(
        [
            r"""[\\p{Han}]+""",
            r"""[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'re|'d)?""",
            r"""[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'re|'d)?""",
            r"""\\p{N}{1,3}""",
            r""" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*""",
            r"""\\s*[\\r\\n]+""",
            r"""\\s+(?!\\S)""",
            r"""\\s+""",
        ]
    )

    def __init__(self, vocab_file):
        raise RuntimeError("never run")
''' % RESERVED
TEXTS = ["Hello world! It's a TEST, isn't it? They'RE here.", "  leading spaces\n\n\ttabs\r\nand CRLF   ",
         "数字 12345678 和汉字混在一起：你好，世界！", "emoji 😀👍🏽 and accents: café naïve Ωμέγα", "",
         "def f(x):\n    return x ** 2  # comment\n", "a" * 300 + " " + "ab" * 50, "[BOS]inside text<|im_end|>tail",
         "mixedCASEWords and_snake_case 3.14159e-10"]


def _ranks() -> dict[bytes, int]:
    """A real BPE vocabulary as tiktoken ranks: the 256 bytes, then the demo tokenizer's merges in order."""
    decode = {c: b for b, c in enumerate(byte_chars())}
    merges = json.loads((DEMO / "tokenizer.json").read_text())["model"]["merges"]
    ranks = {bytes([b]): b for b in range(256)}
    for pair in merges:
        a, b = pair if isinstance(pair, list) else pair.split(" ")
        token = bytes(decode[c] for c in a + b)
        ranks.setdefault(token, len(ranks))
    return ranks


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kimi_vocab")
    ranks = _ranks()
    (out / "tiktoken.model").write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    (out / "tokenization_kimi.py").write_text(MODULE)
    n = len(ranks)
    names = {n: "[BOS]", n + 1: "[EOS]", n + 2: "<|im_end|>", n + 3: "<|im_user|>", n + 4: "<|im_assistant|>"}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]",
        "added_tokens_decoder": {str(i): {"content": c, "special": True} for i, c in names.items()},
        "chat_template": "{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}<|im_end|>{% endfor %}"
                         "{% if add_generation_prompt %}<|im_assistant|>{% endif %}"}))
    return out


def _reference(folder: Path):
    ranks = _ranks()
    n = len(ranks)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    named = {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()}
    special = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + RESERVED + 2)}
    ns: dict = {}
    exec(compile(MODULE.replace("import tiktoken", ""), "module", "exec"), ns)       # the test's own module
    return tiktoken.Encoding("ref", pat_str=ns["TikTokenTokenizer"].pat_str, mergeable_ranks=ranks,
                             special_tokens=special)


def test_every_text_encodes_to_tiktokens_ids_and_decodes_back(folder):
    tok, ref = Tokenizer.from_dir(folder), _reference(folder)
    for text in TEXTS:
        want = ref.encode(text, allowed_special="all")
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.decode(want, skip_special_tokens=False) == ref.decode(want)
    assert tok.vocab_size == ref.n_vocab
    assert tok.bos_token_id == ref.encode_single_token("[BOS]")
    assert tok.eos_token_ids == {ref.encode_single_token("[EOS]")}
    assert tok.decode(ref.encode("[EOS]x", allowed_special="all")) == "x"           # specials skipped
    last = ref.n_vocab - 1
    assert tok.vocab_token(last) == f"<|reserved_token_{last}|>"


def test_a_tiktoken_model_folder_chats_and_streams(folder, tmp_path, capsys):
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import build_tiny_model
    model = build_tiny_model(tmp_path / "m", "deepseek_v3", vocab_size=len(_ranks()) + RESERVED + 2)
    (model / "tokenizer.json").unlink()
    for f in ("tokenizer_config.json",):
        (model / f).unlink(missing_ok=True)
    for f in folder.iterdir():
        shutil.copy(f, model / f.name)
    tok = Tokenizer.from_dir(model)
    ids = tok.apply_chat_template([{"role": "user", "content": "你好 world"}], tokenize=True)
    assert ids[0] == tok.token_to_id("<|im_user|>") and ids[-1] == tok.token_to_id("<|im_assistant|>")
    assert main(["generate", "--model", str(model), "--device", "cpu", "--prompt", "Hello 世界", "--max-tokens", "5",
                 "--temperature", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completion_tokens"] >= 1 and out["text"] == tok.decode(out["token_ids"])


@pytest.mark.parametrize("change, says", [
    (lambda f: (f / "tokenization_kimi.py").unlink(), "ships tiktoken.model but no tokenization_*.py, so its "
                                                        "pre-tokenising pattern (pat_str) is unknown; copy the"),
    (lambda f: (f / "tokenization_kimi.py").write_text("import re\npat_str = re.compile('x').pattern\n"),
     "builds pat_str from more than literal strings"),
    (lambda f: (f / "tokenization_kimi.py").write_text("class T:\n    pass\n"), "assigns no pat_str"),
    (lambda f: (f / "tiktoken.model").write_bytes(b"not-base64! 0\n"), "line 1 is not '<base64 token> <rank>'"),
    (lambda f: (f / "tiktoken.model").write_bytes(b"IQ== 0\nIg== 5\n"), "the ranks are not 0 to 1, each once"),
    (lambda f: (f / "tiktoken.model").write_bytes(b"IQ== 0\n"), "of the 256 single bytes have no token"),
    (lambda f: (f / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": {"2000000000": {"content": "<x>"}}})), "no vocabulary has that many special tokens"),
])
def test_a_tiktoken_folder_missing_a_part_is_one_line_naming_it(folder, tmp_path, change, says):
    broken = tmp_path / "b"
    shutil.copytree(folder, broken)
    change(broken)
    with pytest.raises(ModelLoadError) as e:
        Tokenizer.from_dir(broken)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_module_is_read_never_run(folder, tmp_path):
    other = tmp_path / "o"
    shutil.copytree(folder, other)
    text = (other / "tokenization_kimi.py").read_text()
    (other / "tokenization_kimi.py").write_text("raise SystemExit('ran')\n" + text)
    assert Tokenizer.from_dir(other).encode("hi", add_special_tokens=False)


def test_odd_keys_in_the_tokenizer_config_are_passed_over(folder, tmp_path):
    # a superscript digit is no token id, and a module named outside the folder is never looked for
    other = tmp_path / "odd"
    shutil.copytree(folder, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"]["\u00b2"] = {"content": "<odd>"}
    cfg["auto_map"] = {"AutoTokenizer": ["..etc.passwd.Class", None]}
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(other)              # the folder's only tokenization_*.py is read instead
    assert tok.encode("hi", add_special_tokens=False) == Tokenizer.from_dir(folder).encode("hi", add_special_tokens=False)
