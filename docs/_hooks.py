"""MkDocs hook: the notebooks in `notebooks/` become pages of the site.

The notebooks are jupytext percent-format `.py` files kept outside `docs/`. This hook adds
every one that exists to the site's files, converted by the `mkdocs-jupyter` plugin without
executing it: its executed copy `build/notebooks/<name>.ipynb` (figures and printed numbers,
written by the test run or `python docs/_notebooks.py`) when that copy was made from the
current source, else the source `notebooks/<name>.py` (code only). It fills the nav's
"Notebooks" section with them, sorted by name, so the nav never names a notebook that is not
there (`--strict` stays clean while notebooks are added or renamed).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SECTION = "Notebooks"
# A percent-format notebook: a cell marker `# %%` at the start of a line.
_CELL = re.compile(r"^# %%", re.MULTILINE)


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


def on_config(config):
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
    return files


def on_serve(server, config, builder):
    server.watch(str(NOTEBOOKS))
    return server
