"""Several GPUs of one host: the model's layers split into pipeline stages, one process per GPU.

:mod:`engine.parallel.plan` decides which layers each stage holds, :mod:`engine.parallel.stages` loads
one stage (a slice of the model with its own expert pool, KV cache and budget),
:mod:`engine.parallel.load` loads the first stage with the others beside it,
:mod:`engine.parallel.pipeline` starts and drives the other stages' processes from the engine's
own process (the first stage), :mod:`engine.parallel.changes` takes live options to every stage or to
none, and :mod:`engine.parallel.worker` is what those processes run.
"""
