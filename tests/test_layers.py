"""The import contracts of pyproject.toml ([tool.importlinter]), checked with import-linter: the kernels
import nothing from the engine, neither imports the workbench or Qt, and the workbench reaches the engine
only through the bridge (app/bridge_api.py is its one importer)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    script = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(script), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 kept, 0 broken" in done.stdout
