"""The ``strata`` command (strata/cli.py): the one place that imports both the engine and the workbench."""
