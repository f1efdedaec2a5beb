"""The documentation site builds with `mkdocs build --strict`: no broken reference, no warning
(API pages from the docstrings, the docs pages, the notebooks, the gallery)."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The `docs` extra: mkdocs, the Material theme, mkdocstrings' Python handler, mkdocs-jupyter.
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter", "jupytext")


def _missing():
    missing = []
    for name in DOCS_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


def test_gallery_images_exist_and_are_small():
    """Every figure the gallery page shows is committed, and small (< 200 kB)."""
    page = (ROOT / "docs" / "gallery.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page)
    assert images, "the gallery shows no figure"
    for image in images:
        path = ROOT / "docs" / image
        assert path.is_file(), f"{image} is missing: run `python docs/gallery.py`"
        assert path.stat().st_size < 200_000, f"{image} is {path.stat().st_size} bytes"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    missing = _missing()
    if missing:
        pytest.skip(f"the docs extra is not installed (pip install -e '.[docs]'): no {missing}")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    for page in ("index.html", "api/workbench/index.html", "gallery/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # A notebook run from its current source (`build/notebooks/`, written by the notebook tests)
    # is shown with its outputs: its page holds its figures. (`.ci/run` checks every notebook
    # after the test run, when all of them have been run.)
    spec = importlib.util.spec_from_file_location("_notebooks", ROOT / "docs" / "_notebooks.py")
    executed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(executed)
    run = [
        p.stem for p in sorted((ROOT / "notebooks").glob("[!_]*.py")) if executed.current_copy(p)
    ]
    assert executed.pages_without_figures(tmp_path / "site", run) == []
