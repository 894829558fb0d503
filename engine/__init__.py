"""Strata engine: run Mixture-of-Experts models on a GPU smaller than the model."""
import importlib.util as _util
from pathlib import Path as _Path


def _check_kernels_package() -> None:
    """Strata's ``kernels`` package sits beside ``engine``; the Hub package of the same import name
    (which transformers 5.25 and later installs) would hide it and fail later with a puzzling import error."""
    found = _util.find_spec("kernels")
    if found is None or found.origin is None or not _Path(found.origin).is_file():
        return       # a frozen build keeps its modules in an archive; a missing package fails on its own
    here = _Path(__file__).resolve().parent.parent
    if _Path(found.origin).resolve().parent.parent != here:
        where = str(_Path(found.origin).parent)
        raise ImportError(f"the package 'kernels' resolves to {where}, not to Strata's kernels in {here}: the Hugging "
                          "Face Hub package of that name hides it; run Strata in its own environment "
                          "(packaging/bootstrap.sh makes one) or remove that package there (pip uninstall kernels)")


_check_kernels_package()
from engine.config import EngineConfig
from engine.context import ContextOverflowError
from engine.guided import Guide
from engine.errors import ConfigError, DeviceOutOfMemoryError, ModelLoadError, ReconfigureError, StrataError, UnsupportedModelError
from engine.outputs import RequestDelta, RequestOutput
from engine.sampling import SamplingParams
from engine.telemetry import EngineStats, ExpertStats, MemoryStats

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "Guide", "RequestOutput", "RequestDelta", "EngineStats",
           "ExpertStats", "MemoryStats", "StrataError", "DeviceOutOfMemoryError", "ModelLoadError", "UnsupportedModelError", "ConfigError",
           "ReconfigureError", "ContextOverflowError"]


def __getattr__(name: str):
    # torch-heavy modules load on first use, so `import engine` stays cheap for the CLI's --help
    if name == "LLM":
        from engine.llm import LLM
        return LLM
    if name == "LLMEngine":
        from engine.engine import LLMEngine
        return LLMEngine
    raise AttributeError(name)
