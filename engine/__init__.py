"""Strata engine: run Mixture-of-Experts models on a GPU smaller than the model."""
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
