"""MkDocs hook: the notebooks in `notebooks/` become pages of the site.

The notebooks are jupytext percent-format `.py` files kept outside `docs/`. This hook adds
every one that exists to the site's files (as `notebooks/<name>.py`, converted by the
`mkdocs-jupyter` plugin without executing it) and fills the nav's "Notebooks" section with
them, sorted by name, so the nav never names a notebook that is not there (`--strict` stays
clean while notebooks are added or renamed).
"""

from __future__ import annotations

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


def on_config(config):
    pages = [f"notebooks/{p.name}" for p in notebooks()]
    nav = config.nav or []
    for i, entry in enumerate(nav):
        if isinstance(entry, dict) and SECTION in entry:
            if pages:
                entry[SECTION] = pages
            else:
                del nav[i]
            break
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which wraps the notebook files
def on_files(files: Files, config) -> Files:
    for p in notebooks():
        files.append(
            File(
                f"notebooks/{p.name}",
                src_dir=str(ROOT),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    return files


def on_serve(server, config, builder):
    server.watch(str(NOTEBOOKS))
    return server
