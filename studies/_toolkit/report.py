"""Helpers for the reports and plots studies write.

matplotlib is an optional extra (`pip install workbench[plots]`): nothing here imports it until a
figure is made or saved, and `have_matplotlib()` lets a study skip its plots when it is missing.
Figures are made with `matplotlib.figure.Figure` directly rather than through `pyplot`, so they
need no GUI, are not kept alive by pyplot's global figure list, and render with the non-interactive
Agg backend; if pyplot has not been imported yet, the Agg backend is also selected for it.
"""

from __future__ import annotations

import importlib.util
import numbers
import os
import pathlib
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from workbench.io import atomic_open

__all__ = [
    "code_block",
    "demote_headings",
    "have_matplotlib",
    "markdown_table",
    "new_figure",
    "progress",
    "reduction_note",
    "save_figure",
]


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], floatfmt: str = ".3g"
) -> str:
    """Format rows as a GitHub-flavoured markdown table.

    Floats (Python or numpy) are formatted with `floatfmt`; integers in full; `None` as an empty
    cell; anything else with `str`. Columns whose cells are all numbers are right-aligned. `|`
    in a cell is escaped and newlines become `<br>`. Columns are padded so the raw text lines up.

    **Arguments:**

    - `headers`: the column names.
    - `rows`: one sequence per row, each as long as `headers`.
    - `floatfmt`: a format spec for floats, as in `format(x, floatfmt)`.

    **Returns:** the table, lines joined by `\\n`, without a trailing newline.

    ```python
    markdown_table(["h", "error"], [(0.1, 1.23e-4), (0.05, 3.1e-5)])
    # | h    | error    |
    # | ---: | -------: |
    # |  0.1 | 0.000123 |
    # | 0.05 |  3.1e-05 |
    ```
    """
    try:
        format(1.5, floatfmt)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"markdown_table: floatfmt={floatfmt!r} is not a valid float format spec "
            "(examples: '.3g', '.2e', '.4f')."
        ) from e
    headers = [_escape(str(h)) for h in headers]
    if not headers:
        raise ValueError("markdown_table: headers is empty; give at least one column name.")
    body: list[list[str]] = []
    numeric = [True] * len(headers)
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != len(headers):
            raise ValueError(
                f"markdown_table: row {i} has {len(row)} cells but there are {len(headers)} "
                f"headers {headers}; row {i} = {row!r}."
            )
        for j, cell in enumerate(row):
            if cell is not None and not _is_number(cell):
                numeric[j] = False
        body.append([_format_cell(cell, floatfmt) for cell in row])
    widths = [max([len(headers[j]), 3, *(len(r[j]) for r in body)]) for j in range(len(headers))]

    def line(cells: Sequence[str], align: bool = True) -> str:
        padded = [
            c.rjust(w) if align and num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = [
        ("-" * (w - 1) + ":") if num and body else "-" * w
        for w, num in zip(widths, numeric, strict=True)
    ]
    return "\n".join([line(headers, align=False), line(rule), *(line(r) for r in body)])


def code_block(text: str, language: str = "") -> str:
    """Wrap `text` in a fenced markdown code block whose fence is longer than any in `text`."""
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def demote_headings(markdown: str, levels: int = 1) -> str:
    """Add `levels` `#` to every ATX heading outside code blocks (`# A` -> `## A`), capped at 6.

    Used to nest one study's report under a heading of a combined report.
    """
    out = []
    fence: str | None = None
    for line in markdown.splitlines():
        stripped = line.lstrip()
        opening = re.match(r"(`{3,}|~{3,})", stripped)
        if opening:
            if fence is None:
                fence = opening.group(1)
            elif stripped.startswith(fence):
                fence = None
        elif fence is None and re.match(r"#{1,6}(\s|$)", line):
            hashes = len(line) - len(line.lstrip("#"))
            line = "#" * min(hashes + levels, 6) + line[hashes:]
        out.append(line)
    return "\n".join(out)


def _is_number(cell: Any) -> bool:
    return isinstance(cell, numbers.Real) and not isinstance(cell, bool)


def _format_cell(cell: Any, floatfmt: str) -> str:
    if cell is None:
        return ""
    if isinstance(cell, bool):
        return str(cell)
    if isinstance(cell, numbers.Integral):
        return str(int(cell))
    if isinstance(cell, numbers.Real):
        return format(float(cell), floatfmt)
    return _escape(str(cell))


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported (the `plots` extra is installed). Imports nothing."""
    return importlib.util.find_spec("matplotlib") is not None


def new_figure(
    nrows: int = 1,
    ncols: int = 1,
    *,
    figsize: tuple[float, float] | None = None,
    **subplots_kwargs: Any,
) -> tuple[Any, Any]:
    """Make a figure and its axes without pyplot, for `save_figure`.

    **Arguments:**

    - `nrows`, `ncols`: the grid of axes.
    - `figsize`: width and height in inches; matplotlib's default if `None`.
    - `**subplots_kwargs`: passed to `Figure.subplots` (e.g. `sharex=True`, `squeeze=False`).

    **Returns:** `(figure, axes)`, as `pyplot.subplots` would.

    ```python
    fig, ax = new_figure(figsize=(5, 4))
    ax.loglog(steps, errors, "o-")
    save_figure(fig, out / "convergence.png")
    ```
    """
    _matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, ncols, **subplots_kwargs)
    return fig, axes


def save_figure(
    fig: Any, path: str | os.PathLike[str], *, dpi: int = 150, **savefig_kwargs: Any
) -> pathlib.Path:
    """Save `fig` to `path` atomically and close it.

    The format comes from the file suffix (`.png`, `.pdf`, `.svg`, ...). The image is rendered
    into a temporary file next to `path` that replaces `path` only once it is complete (see
    `workbench.io.atomic_open`). The figure is closed afterwards, also on failure, so a study
    making many plots does not accumulate them.

    **Arguments:**

    - `fig`: a `matplotlib.figure.Figure` (from `new_figure` or pyplot).
    - `path`: the destination; its folder must exist.
    - `dpi`: resolution for raster formats.
    - `**savefig_kwargs`: passed to `Figure.savefig`.

    **Returns:** `path` as a `pathlib.Path`.
    """
    matplotlib = _matplotlib()
    path = pathlib.Path(path)
    fmt = path.suffix.lstrip(".").lower()
    try:
        supported = fig.canvas.get_supported_filetypes()
        if fmt not in supported:
            raise ValueError(
                f"save_figure: path={str(path)!r} has suffix {path.suffix!r}, which is not an "
                f"image format matplotlib {matplotlib.__version__} can write; valid suffixes: "
                f"{', '.join('.' + s for s in sorted(supported))}."
            )
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format=fmt, dpi=dpi, **savefig_kwargs)
    finally:
        _close(fig)
    return path


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "Plots need matplotlib, which is not installed; install it with "
            "`pip install 'workbench[plots]'`, or check `have_matplotlib()` before plotting."
        ) from e
    # Select Agg only while pyplot is unused: switching later would close a user's (e.g. a
    # notebook's) open figures. Figures from `new_figure` never go through pyplot anyway.
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    return matplotlib


def _close(fig: Any) -> None:
    # A pyplot-made figure stays alive in pyplot's registry until closed; one from `new_figure`
    # is not registered, and `pyplot.close` ignores it. Only touch pyplot if it is in use.
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


def progress(iterable: Iterable[Any], *, desc: str, total: int | None = None) -> Any:
    """`tqdm(iterable)` on stderr (hidden when stderr is not a terminal, or when
    `WORKBENCH_PROGRESS=0`); tqdm's widget in Jupyter when `ipywidgets` is installed, its text
    bar otherwise, without a warning (`workbench._progress.tqdm_class`)."""
    from workbench._progress import tqdm_class

    tqdm = tqdm_class()

    hide = True if os.environ.get("WORKBENCH_PROGRESS", "1") == "0" else None
    return tqdm(iterable, desc=desc, total=total, disable=hide, leave=False)


def reduction_note(fit: Any) -> str:
    """`", order reduction from p"` when an `OrderFit` flags order reduction (`p` = the
    large-step order), else `""`: appended to fitted orders in legends and tables."""
    if fit is None or not fit.order_reduction:
        return ""
    pre = fit.preasymptotic_order
    return ", order reduction" + ("" if pre is None else f" from {pre:.2f}")


WIDE_CI = 1.0
"""A 95 % interval on an observed order wider than this cannot tell neighbouring integer orders
apart; reports mark it (typically too few ladder points at smoke size)."""


def _is_wide(low: float, high: float) -> bool:
    return not (high - low <= WIDE_CI)  # NaN counts as wide


def ci_cell(low: float, high: float) -> str:
    """`"[low, high]"`, with `" (wide)"` appended when the interval is wider than `WIDE_CI`."""
    return f"[{low:.2f}, {high:.2f}]" + (" (wide)" if _is_wide(low, high) else "")


def wide_ci_note(intervals: Iterable[Any]) -> str:
    """A sentence for reports when any `(low, high)` of `intervals` (`None` skipped) is wider
    than `WIDE_CI`, else `""`."""
    wide = [ci for ci in intervals if ci is not None and _is_wide(*ci)]
    if not wide:
        return ""
    return (
        f"*{len(wide)} interval(s) marked (wide) are wider than {WIDE_CI:g}: they cannot tell "
        "neighbouring orders apart (too few ladder points, typical at smoke size); rerun at full "
        "size before reading those orders.*"
    )
