"""Progress bars for long library loops: `tqdm` when it is installed, otherwise none.

`tqdm` is not a runtime dependency of the library (it comes with the `studies` extra), so this is
the one place that imports it, lazily. Bars go to stderr; `disable=None` lets tqdm hide the bar
when stderr is not a terminal, and `WORKBENCH_PROGRESS=0` hides every bar.

In a Jupyter kernel the bar is tqdm's widget (`tqdm.auto`) when `ipywidgets` can be imported (the
`notebooks` extra installs it). Without `ipywidgets` it is the text bar `tqdm.std.tqdm`, chosen
here before `tqdm.auto` is imported, because `tqdm.auto` would print a `TqdmWarning` ("IProgress
not found") into the notebook's output.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["progress_bar", "tqdm_class"]


class _NoBar:
    def update(self, n: int = 1) -> None:
        del n

    def set_postfix(self, *args, **kwargs) -> None:
        del args, kwargs


def _has_ipywidgets() -> bool:
    try:
        return importlib.util.find_spec("ipywidgets") is not None
    except (ImportError, ValueError):  # a broken or blocked entry in `sys.modules`
        return False


def tqdm_class() -> type:
    """The `tqdm` bar class: `tqdm.auto.tqdm` (a widget in a Jupyter kernel, text elsewhere) when
    `ipywidgets` can be imported, else the text bar `tqdm.std.tqdm`; no warning either way.

    **Raises:** `ImportError` without `tqdm`."""
    from tqdm.std import TqdmWarning, tqdm as text_bar

    if not _has_ipywidgets():
        return text_bar
    with warnings.catch_warnings():
        # An `ipywidgets` that is found but fails to import: tqdm.auto warns and uses the text bar.
        warnings.simplefilter("ignore", TqdmWarning)
        from tqdm.auto import tqdm
    return tqdm


@contextlib.contextmanager
def progress_bar(
    total: int, *, desc: str, disable: bool | None = None, initial: int = 0
) -> Iterator[Any]:
    """A context manager yielding an object with `update(n=1)` and `set_postfix(**values)`: a
    `tqdm` bar, or a no-op.

    **Arguments:**

    - `total`: the number of updates expected; `initial`: the count already done (a resumed
      run).
    - `desc`: the label in front of the bar.
    - `disable`: `True` hides the bar, `False` shows it, `None` (default) shows it only on a
      terminal. `WORKBENCH_PROGRESS=0` in the environment hides it in every case.
    """
    if disable is True or os.environ.get("WORKBENCH_PROGRESS", "1") == "0":
        yield _NoBar()
        return
    try:
        tqdm = tqdm_class()
    except ImportError:
        yield _NoBar()
        return
    with tqdm(total=total, desc=desc, disable=disable, leave=False, initial=initial) as bar:
        yield bar
