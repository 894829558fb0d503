"""The engine's default for torch's CUDA allocator (engine/memory.prefer_expandable_segments)."""
from __future__ import annotations

import torch

from engine.memory import prefer_expandable_segments


def test_expandable_segments_are_asked_for_unless_the_user_configured_the_allocator(monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", asked.append, raising=False)
    assert prefer_expandable_segments({}) and asked == ["expandable_segments:True"]
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        assert not prefer_expandable_segments({name: "max_split_size_mb:128"})
    assert prefer_expandable_segments({"PYTORCH_CUDA_ALLOC_CONF": ""})      # set but empty: not configured
    assert asked == ["expandable_segments:True"] * 2


def test_an_older_torch_is_asked_through_its_older_call_without_a_warning(monkeypatch) -> None:
    import warnings

    asked = []

    def older(settings: str) -> None:
        warnings.warn("deprecated", FutureWarning)
        asked.append(settings)
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", older)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prefer_expandable_segments({})
    assert asked == ["expandable_segments:True"]
