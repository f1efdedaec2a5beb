"""Progress bars for long library loops: `tqdm` when it is installed, otherwise none.

`tqdm` is not a runtime dependency of the library (it comes with the `studies` extra), so this is
the one place that imports it, lazily. Bars go to stderr; `disable=None` lets tqdm hide the bar
when stderr is not a terminal, and `WORKBENCH_PROGRESS=0` hides every bar.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["progress_bar"]


class _NoBar:
    def update(self, n: int = 1) -> None:
        del n

    def set_postfix(self, *args, **kwargs) -> None:
        del args, kwargs


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
        from tqdm.auto import tqdm
    except ImportError:
        yield _NoBar()
        return
    with tqdm(total=total, desc=desc, disable=disable, leave=False, initial=initial) as bar:
        yield bar
