"""Strata's desktop workbench: the only package that imports Qt.

Only :mod:`app.bridge` talks to the engine (and :mod:`app.gpu_poller` to the GPU monitor); widgets
receive frozen dataclasses through Qt signals and never touch the engine or torch.
"""
