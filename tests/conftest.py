"""Shared fixtures: tiny Hugging Face MoE checkpoints of every supported family, built in the test."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Without a GPU, Triton kernels run in the interpreter; set before any test module imports triton.
if not os.path.exists("/dev/nvidia0") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
