"""benchmarks/h200_pick.py: a variant is turned on for the kit only where it won every format's step."""
import json

from benchmarks.h200_pick import main, won


def _cells(**ms):
    return {name.replace("_", "+"): {"cell": name.replace("_", "+"), "step_ms": v} for name, v in ms.items()}


def test_a_variant_wins_only_when_faster_in_every_base_by_the_margin_on_average():
    assert won(_cells(int4=1.0, int4_gemv16=0.97, bf16=1.4, bf16_gemv16=1.38), "gemv16", ["int4", "bf16"])
    assert not won(_cells(int4=1.0, int4_gemv16=0.95, bf16=1.4, bf16_gemv16=1.41), "gemv16", ["int4", "bf16"])
    assert not won(_cells(int4=1.0, int4_gemv16=0.999, bf16=1.4, bf16_gemv16=1.399), "gemv16", ["int4", "bf16"])
    assert not won(_cells(int4=1.0, bf16=1.4, bf16_gemv16=1.3), "gemv16", ["int4", "bf16"])   # a cell missing


def test_the_command_reads_a_step_profile_file_and_says_no_without_one(tmp_path, capsys):
    path = tmp_path / "ab.json"
    path.write_text(json.dumps({"cells": list(_cells(int4=1.0, int4_gemv16=0.9).values()) + [{"cell": "bf16"}]}))
    assert main([str(path), "gemv16", "int4"]) == 0
    assert "int4 x0.900" in capsys.readouterr().out
    assert main([str(tmp_path / "none.json"), "gemv16", "int4"]) == 1
    assert "no step_profile result" in capsys.readouterr().out
