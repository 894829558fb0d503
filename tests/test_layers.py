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


def test_no_import_loops_between_engine_modules():
    # Type-only imports (under TYPE_CHECKING) do not run and may point back; every other import,
    # a function-level one included, must not close a loop.
    import grimp
    graph = grimp.build_graph("engine", exclude_type_checking_imports=True)
    loops = sorted({tuple(sorted((m, dep))) for m in graph.modules
                    for dep in graph.find_modules_directly_imported_by(m)
                    if graph.find_shortest_chain(importer=dep, imported=m)})
    assert not loops, f"engine modules that import each other: {loops}"


def test_a_foreign_kernels_package_is_named_in_one_line(tmp_path):
    """The Hub package also called ``kernels`` (transformers 5.25+ installs it), ahead on the path, would
    hide Strata's kernels: importing the engine says so and how to fix it."""
    import os
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"}
    r = subprocess.run([sys.executable, "-c", "import engine"], cwd=tmp_path.parent, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the package 'kernels' resolves to") and "pip uninstall kernels" in last
