"""The notebooks, executed, for the site: run them once, keep the result, show its outputs.

The notebooks are jupytext percent-format `.py` files in `notebooks/`. `execute(path)` runs one
top to bottom in a fresh `python3` kernel (nbclient; working directory the repository root, so
`import studies` works) and writes the executed notebook, figures and printed numbers included,
to `build/notebooks/<name>.ipynb` (atomically; `build/` is ignored by git), with the SHA-256 of
its source in the notebook's metadata. The kernel runs without progress bars (`WORKBENCH_PROGRESS=0`
for the library's and the studies', `HF_HUB_DISABLE_PROGRESS_BARS=1` for transformers' "Loading
weights" in the MiniLM notebook): a bar (tqdm's widget where `ipywidgets` is installed) means
nothing on a static page, whose widget renderer would come from the network. The test suite does this for every notebook
(`tests/docs/test_notebooks.py`), so after a test run the copies exist.

The site (`docs/_hooks.py`) renders the executed copy of a notebook when its recorded hash is
the current source's, and the bare source (code, no outputs) otherwise: editing a notebook
invalidates its copy until it is run again. To refresh the copies without the tests:

    python docs/_notebooks.py            # execute every notebook (minutes on a 2-core CPU)
    python docs/_notebooks.py --check SITE_DIR   # every notebook page of a built site has a
                                                 # figure, and shows no warning nor traceback
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
_KEY = "workbench"  # the notebook-metadata entry holding the source's hash
_NO_BARS = {"WORKBENCH_PROGRESS": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


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
    client.execute(env=dict(os.environ, **_NO_BARS))  # the kernel's environment
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


# nbconvert's lab template (mkdocs-jupyter's base) marks a stderr stream and an error output
# (the traceback) with this MIME type on the output's `jp-OutputArea-output` element.
_STDERR = "application/vnd.jupyter.stderr"
# What a warning or an exception reads like in any output: `UserWarning: ...`, `ValueError: ...`,
# `Traceback (most recent call last)`.
_ALARM = re.compile(r"\b[A-Za-z_]*(?:Warning|Error)\b:|Traceback \(most recent call last\)")


_VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)  # elements without an end tag


class _Outputs(html.parser.HTMLParser):
    """The outputs of a rendered notebook: `(MIME type, is a widget, text)` of every element with
    the class `jp-OutputArea-output` (the text of everything inside it)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.outputs: list[tuple[str, bool, list[str]]] = []
        self._depth = 0  # open elements inside the current output; 0: not in an output

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            if tag == "br" and self._depth:
                self.outputs[-1][2].append("\n")
            return
        if self._depth:
            self._depth += 1
            return
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if "jp-OutputArea-output" in classes:
            self._depth = 1
            self.outputs.append(
                (attrs.get("data-mime-type") or "", "jupyter-widgets" in classes, [])
            )

    def handle_endtag(self, tag):
        if self._depth and tag not in _VOID:
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.outputs[-1][2].append(data)


def page_problems(page_html: str) -> list[str]:
    """What a rendered notebook page shows that a reader should not see: the text of every
    stderr or error output (a warning, a traceback, a progress bar written to stderr), and of
    every other output that reads like a warning or an exception (`...Warning:`, `...Error:`,
    `Traceback (most recent call last)`), whitespace collapsed, at most 300 characters each; and
    a line for every Jupyter widget output."""
    parser = _Outputs()
    parser.feed(page_html)
    parser.close()
    problems = []
    for mime, widget, parts in parser.outputs:
        text = " ".join("".join(parts).split())
        if widget:
            problems.append(
                "a Jupyter widget (a progress bar?): a static page shows it stale or empty, "
                "with a renderer from the network"
            )
        elif mime == _STDERR or _ALARM.search(text):
            problems.append(text[:300] or f"(an empty {mime} output)")
    return problems


def pages_with_problems(site: Path, names) -> dict[str, list[str]]:
    """`{name: page_problems}` of the notebook pages of a built site that show a warning or a
    traceback (a missing page is `pages_without_figures`' to report)."""
    bad = {}
    for name in names:
        page = Path(site) / "notebooks" / name / "index.html"
        if page.is_file():
            problems = page_problems(page.read_text(encoding="utf-8"))
            if problems:
                bad[name] = problems
    return bad


def _main(argv=None) -> int:
    sys.path.insert(0, str(ROOT / "docs"))
    from _hooks import notebooks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="SITE_DIR", help="check a built site instead")
    args = parser.parse_args(argv)
    if args.check:
        names = [p.stem for p in notebooks()]
        failed = False
        bad = pages_without_figures(Path(args.check), names)
        if bad:
            print(
                f"notebook pages without a figure in {args.check}: {bad} (run the notebooks: "
                "python docs/_notebooks.py, or the tests)",
                file=sys.stderr,
            )
            failed = True
        for name, problems in pages_with_problems(Path(args.check), names).items():
            page = Path(args.check) / "notebooks" / name / "index.html"
            print(
                f"{page}: shows a warning or a traceback (fix it in notebooks/{name}.py or "
                "what it calls):",
                file=sys.stderr,
            )
            for text in problems:
                print(f"    {text}", file=sys.stderr)
            failed = True
        if failed:
            return 1
        print(f"every notebook page of {args.check} shows its figures and no warning")
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
