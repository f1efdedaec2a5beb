"""The notebooks, executed, for the site: run them once, keep the result, show its outputs.

The notebooks are jupytext percent-format `.py` files in `notebooks/`. `execute(path)` runs one
top to bottom in a fresh `python3` kernel (nbclient; working directory the repository root, so
`import studies` works) and writes the executed notebook, figures and printed numbers included,
to `build/notebooks/<name>.ipynb` (atomically; `build/` is ignored by git), with the SHA-256 of
its source in the notebook's metadata. The test suite does this for every notebook
(`tests/docs/test_notebooks.py`), so after a test run the copies exist.

The site (`docs/_hooks.py`) renders the executed copy of a notebook when its recorded hash is
the current source's, and the bare source (code, no outputs) otherwise: editing a notebook
invalidates its copy until it is run again. To refresh the copies without the tests:

    python docs/_notebooks.py            # execute every notebook (minutes on a 2-core CPU)
    python docs/_notebooks.py --check SITE_DIR   # every notebook page of a built site has a figure
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
_KEY = "workbench"  # the notebook-metadata entry holding the source's hash


def source_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def executed_path(path: Path) -> Path:
    """Where the executed copy of notebook `path` lives."""
    return EXECUTED / f"{Path(path).stem}.ipynb"


def current_copy(path: Path) -> Path | None:
    """The executed copy of `path` if it was made from the current source, else None."""
    copy = executed_path(path)
    try:
        meta = json.loads(copy.read_text(encoding="utf-8"))["metadata"].get(_KEY, {})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return copy if meta.get("source_sha256") == source_sha256(path) else None


def execute(path: Path, *, timeout: int = 600):
    """Run notebook `path` top to bottom; write and return the executed notebook (`nbformat`).

    **Raises:** nbclient's `CellExecutionError` (with the traceback) when a cell fails; nothing is
    written then."""
    import jupytext
    import nbclient
    import nbformat

    path = Path(path)
    digest = source_sha256(path)
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    start = time.perf_counter()
    client.execute()
    nb.metadata[_KEY] = {"source_sha256": digest, "seconds": time.perf_counter() - start}
    target = executed_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
        os.chmod(tmp, 0o644)  # mkstemp's file is private; the copy is an ordinary build output
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return nb


def pages_without_figures(site: Path, names) -> list[str]:
    """The notebook pages of a built site (`notebooks/<name>/index.html`) that are missing or
    show no figure (no `<img`)."""
    bad = []
    for name in names:
        page = Path(site) / "notebooks" / name / "index.html"
        if not page.is_file() or "<img" not in page.read_text(encoding="utf-8"):
            bad.append(name)
    return bad


def _main(argv=None) -> int:
    sys.path.insert(0, str(ROOT / "docs"))
    from _hooks import notebooks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="SITE_DIR", help="check a built site instead")
    args = parser.parse_args(argv)
    if args.check:
        bad = pages_without_figures(Path(args.check), [p.stem for p in notebooks()])
        if bad:
            print(f"notebook pages without a figure in {args.check}: {bad} (run the notebooks: "
                  "python docs/_notebooks.py, or the tests)", file=sys.stderr)  # fmt: skip
            return 1
        print(f"every notebook page of {args.check} shows its figures")
        return 0
    for p in notebooks():
        if current_copy(p) is None:
            nb = execute(p)
            print(f"{p.name}: executed in {nb.metadata[_KEY]['seconds']:.1f} s")
        else:
            print(f"{p.name}: executed copy is current")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
