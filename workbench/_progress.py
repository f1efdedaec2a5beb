"""A small, dependency-free progress bar for long loops in studies.

On a terminal the bar redraws one line in place with `\\r`; anywhere else (a CI log, a file,
a notebook's captured stderr) it prints a plain line now and then, so logs stay readable and
short. Both show the count, the total when known, the elapsed time and an estimate of the time
left. Output goes to stderr, so it never mixes with what a command prints on stdout.

Set the environment variable `WORKBENCH_PROGRESS=0` to silence every bar that was not given an
explicit `disable=`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TextIO, TypeVar

__all__ = ["Progress", "format_duration", "progress"]

_T = TypeVar("_T")

_DISABLE_VARIABLE = "WORKBENCH_PROGRESS"
_FALSE_WORDS = ("0", "false", "no", "off")


def format_duration(seconds: float) -> str:
    """Format a duration as `m:ss` or `h:mm:ss` (`"?"` for a negative or non-finite value).

    ```python
    format_duration(75.2)    # "1:15"
    format_duration(3725)    # "1:02:05"
    ```
    """
    if not seconds >= 0 or seconds == float("inf"):  # also catches NaN
        return "?"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


class Progress:
    """Progress of a loop of `total` steps, drawn on stderr.

    Use as a context manager and call `update()` once per step, or wrap an iterable with
    `progress(...)`.

    **Arguments:**

    - `total`: the number of steps, or `None` when unknown (then no bar, percentage or ETA).
    - `desc`: a short label printed before the counts.
    - `disable`: `True` prints nothing; `False` always prints; `None` (default) prints unless the
      environment variable `WORKBENCH_PROGRESS` is `0`, `false`, `no` or `off`.
    - `stream`: where to write; default `sys.stderr` at construction time.
    - `refresh`: on a terminal, the least time in seconds between two redraws.
    - `log_every`: elsewhere, the least time in seconds between two plain lines. The first
      update and the end always print a line.
    - `width`: characters of the bar on a terminal.
    - `clock`: a function returning seconds; the default `time.monotonic`. (Tests pass a fake.)

    ```python
    with Progress(total=len(steps), desc="convergence") as bar:
        for h in steps:
            errors.append(solve(h))
            bar.update()
    ```
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        desc: str = "",
        disable: bool | None = None,
        stream: TextIO | None = None,
        refresh: float = 0.1,
        log_every: float = 30.0,
        width: int = 24,
        clock: Callable[[], float] = time.monotonic,
    ):
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise TypeError(f"Progress: total must be an int or None, got {total!r}.")
        if total is not None and total < 0:
            raise ValueError(f"Progress: total={total} must be >= 0.")
        if disable is None:
            disable = os.environ.get(_DISABLE_VARIABLE, "1").strip().lower() in _FALSE_WORDS
        self.total = total
        self.desc = desc
        self.disabled = bool(disable)
        self.count = 0
        self._stream = sys.stderr if stream is None else stream
        self._refresh = refresh
        self._log_every = log_every
        self._width = width
        self._clock = clock
        self._tty = _is_tty(self._stream)
        self._start = clock()
        self._last_draw: float | None = None
        self._last_len = 0
        self._drawn_count: int | None = None
        self._closed = False

    # -- public ------------------------------------------------------------------------------

    def update(self, n: int = 1) -> None:
        """Record `n` more finished steps and redraw if enough time has passed."""
        self.count += n
        if self.disabled or self._closed:
            return
        now = self._clock()
        interval = self._refresh if self._tty else self._log_every
        if self._last_draw is None or now - self._last_draw >= interval:
            self._draw(now)

    def close(self, *, failed: bool = False) -> None:
        """Draw the final state and end the line. Called by `__exit__`; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.disabled:
            return
        if self._tty and self._drawn_count == self.count and not failed:
            # The line on screen is already the final count: just end it.
            self._stream.write("\n")
            self._stream.flush()
            return
        self._draw(self._clock(), final=True, failed=failed)

    def line(self, now: float | None = None) -> str:
        """The status text, e.g. `fit: 12/100 (12%) 0:03 elapsed, eta 0:22`."""
        now = self._clock() if now is None else now
        elapsed = now - self._start
        parts = []
        if self.desc:
            parts.append(f"{self.desc}:")
        if self.total is not None:
            if self._tty:
                parts.append(self._bar())
            percent = 100.0 * self.count / self.total if self.total else 100.0
            parts.append(f"{self.count}/{self.total} ({percent:.0f}%)")
        else:
            parts.append(f"{self.count}")
        timing = f"{format_duration(elapsed)} elapsed"
        if self.total is not None and 0 < self.count < self.total:
            eta = elapsed / self.count * (self.total - self.count)
            timing += f", eta {format_duration(eta)}"
        elif self.total is None and self.count and elapsed > 0:
            timing += f", {self.count / elapsed:.3g}/s"
        parts.append(timing)
        return " ".join(parts)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # GeneratorExit is how a `progress(...)` loop left early with `break` ends: not an error.
        failed = exc_type is not None and not issubclass(exc_type, GeneratorExit)
        self.close(failed=failed)

    # -- private -----------------------------------------------------------------------------

    def _bar(self) -> str:
        assert self.total is not None
        fraction = min(self.count / self.total, 1.0) if self.total else 1.0
        filled = int(round(fraction * self._width))
        return "[" + "#" * filled + "-" * (self._width - filled) + "]"

    def _draw(self, now: float, *, final: bool = False, failed: bool = False) -> None:
        text = self.line(now)
        if failed:
            text += " (stopped by an error)"
        if self._tty:
            # Pad with spaces to wipe what is left of a longer previous line.
            padding = " " * max(self._last_len - len(text), 0)
            self._stream.write("\r" + text + padding + ("\n" if final else ""))
            self._last_len = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
        self._last_draw = now
        self._drawn_count = self.count


def progress(
    iterable: Iterable[_T],
    *,
    total: int | None = None,
    desc: str = "",
    disable: bool | None = None,
    stream: TextIO | None = None,
    **kwargs,
) -> Iterator[_T]:
    """Iterate over `iterable`, showing a `Progress` bar on stderr.

    **Arguments:**

    - `iterable`: the items; its length is the total when it has one and `total` is not given.
    - `total`, `desc`, `disable`, `stream`, `**kwargs`: as for `Progress`.

    **Returns:** an iterator over the same items.

    ```python
    for n in progress([16, 32, 64, 128], desc="steps"):
        ...
    ```
    """
    if total is None and isinstance(iterable, Sized):
        total = len(iterable)
    with Progress(total, desc=desc, disable=disable, stream=stream, **kwargs) as bar:
        for item in iterable:
            yield item
            bar.update()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a minimal stream object, or a closed one
        return False
