"""Strata's desktop workbench: the only package that imports Qt.

Only :mod:`app.bridge` drives the engine, and only :mod:`app.bridge_api` imports it (an import contract in
pyproject.toml); widgets receive frozen dataclasses through Qt signals and never touch the engine or torch.
"""
