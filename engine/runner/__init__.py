"""The runner: batch building (:mod:`engine.runner.batch`), host staging of what a step reads back
(:mod:`engine.runner.staging`) and the model runner that drives a step (:mod:`engine.runner.model_runner`)."""
from engine.runner.batch import SeqPart, build_batch, decode_inputs, decode_meta, group_inputs, slot_of
from engine.runner.model_runner import ModelRunner, Sampled
from engine.runner.staging import HostStaging

__all__ = ["HostStaging", "ModelRunner", "Sampled", "SeqPart", "build_batch", "decode_inputs", "decode_meta", "group_inputs",
           "slot_of"]
