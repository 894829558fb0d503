"""``python -m strata``: the same as ``main.py`` and the installed ``strata`` command."""
from strata.cli import run

run()
