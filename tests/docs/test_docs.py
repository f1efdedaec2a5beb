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
_spec = importlib.util.spec_from_file_location("_notebooks", ROOT / "docs" / "_notebooks.py")
executed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(executed)
# The `docs` extra: mkdocs, the Material theme, mkdocstrings' Python handler, mkdocs-jupyter.
# django-static-mathjax (import name `mathjax`): MathJax's files, served from the site.
DOCS_MODULES = (
    "mkdocs",
    "material",
    "mkdocstrings_handlers.python",
    "mkdocs_jupyter",
    "jupytext",
    "mathjax",
)


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
    # is shown with its outputs: its page holds its figures, and no warning nor traceback.
    # (`.ci/run` checks every notebook after the test run, when all of them have been run.)
    run = [
        p.stem for p in sorted((ROOT / "notebooks").glob("[!_]*.py")) if executed.current_copy(p)
    ]
    assert executed.pages_without_figures(tmp_path / "site", run) == []
    assert executed.pages_with_problems(tmp_path / "site", run) == {}
    # The formulas need no network: every script a page loads is the site's own, MathJax's too.
    remote, pages = set(), list((tmp_path / "site").rglob("*.html"))
    for page in pages:
        remote.update(re.findall(r"<script[^>]*\ssrc=\"(https?:[^\"]*)", page.read_text("utf-8")))
    assert remote == set(), f"pages load scripts from the network: {sorted(remote)}"
    mathjax = tmp_path / "site" / "javascripts" / "mathjax"
    assert (mathjax / "tex-mml-chtml.js").is_file()
    assert list((mathjax / "output" / "chtml" / "fonts").rglob("*.woff")), "no MathJax fonts"
    index = (tmp_path / "site" / "index.html").read_text("utf-8")
    assert 'src="javascripts/mathjax/tex-mml-chtml.js"' in index


# A notebook page as mkdocs-jupyter renders it (nbconvert's lab template), cut down: a code cell
# whose source mentions warnings, a printed result, a figure, and `{stderr}` when given.
_PAGE = """<html><body><div class="jp-Cell jp-CodeCell">
<div class="jp-InputArea"><pre>import warnings  # a UserWarning: in the source is not an output</pre></div>
<div class="jp-OutputArea jp-Cell-outputArea"><div class="jp-OutputArea-child">
<div class="jp-OutputPrompt jp-OutputArea-prompt"></div>
<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="text/plain">
<pre>max error 1.2e-12<br>observed order 2.00 &lt; 2.1</pre></div></div>
<div class="jp-OutputArea-child"><div class="jp-RenderedImage jp-OutputArea-output">
<img src="data:image/png;base64,AAAA" alt="figure"></div></div>{stderr}</div></div>
</body></html>"""
_STDERR = """<div class="jp-OutputArea-child"><div class="jp-OutputPrompt jp-OutputArea-prompt"></div>
<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr">
<pre>{text}</pre></div></div>"""
_TQDM = (
    "/venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. "
    "Please update jupyter and ipywidgets."
)


def test_notebook_page_checker_refuses_warnings_and_tracebacks():
    assert executed.page_problems(_PAGE.format(stderr="")) == []
    # A warning on stderr (the red box): refused, with its text.
    page = _PAGE.format(stderr=_STDERR.format(text=_TQDM + "<br>  from .autonotebook import tqdm"))
    assert executed.page_problems(page) == [_TQDM + " from .autonotebook import tqdm"]
    # A traceback (an error output renders as stderr too) and any stderr text, e.g. a bar.
    trace = "<span>ValueError</span> Traceback (most recent call last)<br>ValueError: n=0"
    assert executed.page_problems(_PAGE.format(stderr=_STDERR.format(text=trace))) == [
        "ValueError Traceback (most recent call last) ValueError: n=0"
    ]
    bar = "train: 40%|████ | 2/5"
    assert executed.page_problems(_PAGE.format(stderr=_STDERR.format(text=bar))) == [bar]
    # A warning printed to stdout is refused as well; an empty stderr output is named.
    printed = _PAGE.replace("max error 1.2e-12", "RuntimeWarning: overflow in exp")
    assert executed.page_problems(printed) == [
        "RuntimeWarning: overflow in exp observed order 2.00 < 2.1"
    ]
    assert executed.page_problems(_PAGE.format(stderr=_STDERR.format(text=""))) == [
        "(an empty application/vnd.jupyter.stderr output)"
    ]
    # A widget (tqdm's bar in a kernel with ipywidgets): its view needs a live kernel.
    widget = """<div class="jp-OutputArea-child">
<div class="jupyter-widgets jp-OutputArea-output" id="3063"><script type="text/javascript">
var element = document.getElementById('3063');</script>
<script type="application/vnd.jupyter.widget-view+json">{"model_id": "83ad"}</script></div></div>"""
    (problem,) = executed.page_problems(_PAGE.format(stderr=widget))
    assert problem.startswith("a Jupyter widget")


def test_notebook_page_check_names_the_page_and_the_text(tmp_path, capsys):
    """`python docs/_notebooks.py --check SITE`: 0 on clean pages, else 1 naming each page."""
    pytest.importorskip("mkdocs", reason="the check lists the notebooks with docs/_hooks.py")
    names = [p.stem for p in sorted((ROOT / "notebooks").glob("[!_]*.py"))]
    for name in names:
        page = tmp_path / "notebooks" / name / "index.html"
        page.parent.mkdir(parents=True)
        page.write_text(_PAGE.format(stderr=""), encoding="utf-8")
    assert executed._main(["--check", str(tmp_path)]) == 0
    assert executed.pages_with_problems(tmp_path, names) == {}
    capsys.readouterr()

    warned = tmp_path / "notebooks" / names[-1] / "index.html"
    warned.write_text(_PAGE.format(stderr=_STDERR.format(text=_TQDM)), encoding="utf-8")
    assert executed.pages_with_problems(tmp_path, names) == {names[-1]: [_TQDM]}
    assert executed._main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{warned}: shows a warning or a traceback" in err
    assert _TQDM in err


def test_notebook_page_checker_on_pages_mkdocs_jupyter_renders(tmp_path):
    """The checker reads the pages the site's notebook renderer really writes: a stderr warning
    and a traceback are refused, a printed result passes."""
    pytest.importorskip("mkdocs_jupyter", reason="renders with the docs extra's mkdocs-jupyter")
    import nbformat
    from mkdocs_jupyter.convert import nb2html
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    def page(*outputs):
        path = tmp_path / "page.ipynb"
        nbformat.write(new_notebook(cells=[new_code_cell("f()", outputs=list(outputs))]), path)
        return nb2html(str(path))

    printed = new_output("stream", name="stdout", text="max error 1.2e-12\n")
    assert executed.page_problems(page(printed)) == []
    warned = new_output(
        "stream", name="stderr", text=_TQDM + "\n  from .autonotebook import tqdm\n"
    )
    assert executed.page_problems(page(printed, warned)) == [
        _TQDM + " from .autonotebook import tqdm"
    ]
    trace = ["\x1b[31mValueError\x1b[0m  Traceback (most recent call last)", "ValueError: n=0"]
    error = new_output("error", ename="ValueError", evalue="n=0", traceback=trace)
    assert executed.page_problems(page(error)) == [
        "ValueError Traceback (most recent call last) ValueError: n=0"
    ]
