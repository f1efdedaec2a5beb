"""MkDocs hook: the notebooks in `notebooks/` become pages of the site.

The notebooks are jupytext percent-format `.py` files kept outside `docs/`. This hook adds
every one that exists to the site's files, converted by the `mkdocs-jupyter` plugin without
executing it: its executed copy `build/notebooks/<name>.ipynb` (figures and printed numbers,
written by the test run or `python docs/_notebooks.py`) when that copy was made from the
current source, else the source `notebooks/<name>.py` (code only). It fills the nav's
"Notebooks" section with them, sorted by name, so the nav never names a notebook that is not
there (`--strict` stays clean while notebooks are added or renamed).

It also serves MathJax from the site itself, so the formulas render offline: the files of
MathJax 3's `tex-mml-chtml` component (and what it loads on demand: fonts, TeX extensions, the
menu and accessibility code) come from the `django-static-mathjax` package of the `docs` extra (a
wheel of MathJax's release files with no dependency; its import name is `mathjax`), and go into
the built site under `javascripts/mathjax/`, which `mkdocs.yml`'s `extra_javascript` names. No
MathJax file is kept in this repository.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SECTION = "Notebooks"
# A percent-format notebook: a cell marker `# %%` at the start of a line.
_CELL = re.compile(r"^# %%", re.MULTILINE)
MATHJAX_DIST = "django-static-mathjax"
MATHJAX_DEST = "javascripts/mathjax"
"""Where the MathJax files go in the site (`mkdocs.yml` loads `MATHJAX_DEST/tex-mml-chtml.js`)."""
# MathJax's `es5/` folder, less the other all-in-one components and the SVG output, which the
# site's component (`tex-mml-chtml.js`: TeX and MathML in, CommonHTML out) never loads.
_MATHJAX_SKIP = re.compile(r"^(?!tex-mml-chtml\.js$)[^/]+\.js$|^output/svg|^node-main")


def notebooks() -> list[Path]:
    """The notebooks that exist: `notebooks/*.py` with percent cells, not `_private.py`."""
    if not NOTEBOOKS.is_dir():
        return []
    return [
        p
        for p in sorted(NOTEBOOKS.glob("*.py"))
        if not p.name.startswith("_") and _CELL.search(p.read_text(encoding="utf-8"))
    ]


def _executed():
    """`docs/_notebooks.py` (a sibling file, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "_notebooks", Path(__file__).with_name("_notebooks.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[tuple[str, Path]]:
    """`(page source path, its folder)` of every notebook: the executed copy when current."""
    executed = _executed()
    out = []
    for p in notebooks():
        copy = executed.current_copy(p)
        out.append(
            (f"notebooks/{p.stem}.ipynb", copy.parent.parent)
            if copy
            else (f"notebooks/{p.name}", ROOT)
        )
    return out


def mathjax_files() -> dict[str, Path]:
    """`{path in the site: file}` of the MathJax files the site serves (see the module's doc).

    **Raises:** `PluginError` when the `docs` extra's `django-static-mathjax` is not installed."""
    try:
        dist = importlib.metadata.distribution(MATHJAX_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise PluginError(
            f"the site serves MathJax from the {MATHJAX_DIST} package, which is not installed: "
            "pip install -e '.[docs]'"
        ) from None
    root = Path(dist.locate_file("mathjax/static/mathjax"))
    es5 = root / "es5"
    if not (es5 / "tex-mml-chtml.js").is_file():
        raise PluginError(f"{MATHJAX_DIST}: no es5/tex-mml-chtml.js under {root}")
    out = {f"{MATHJAX_DEST}/LICENSE": root / "LICENSE"}
    for path in sorted(es5.rglob("*")):
        rel = path.relative_to(es5).as_posix()
        if path.is_file() and not _MATHJAX_SKIP.search(rel):
            out[f"{MATHJAX_DEST}/{rel}"] = path
    return out


def on_config(config):
    mathjax_files()  # fails the build early, with the fix, when MathJax is not installed
    pages_ = [name for name, _ in pages()]
    nav = config.nav or []
    for i, entry in enumerate(nav):
        if isinstance(entry, dict) and SECTION in entry:
            if pages_:
                entry[SECTION] = pages_
            else:
                del nav[i]
            break
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which wraps the notebook files
def on_files(files: Files, config) -> Files:
    for name, folder in pages():
        files.append(
            File(
                name,
                src_dir=str(folder),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    for dest, path in mathjax_files().items():
        files.append(File.generated(config, dest, abs_src_path=str(path)))
    return files


def on_serve(server, config, builder):
    server.watch(str(NOTEBOOKS))
    return server
