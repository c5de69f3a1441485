"""A dependency-free progress bar on stderr: items done, rate, ETA.

On a terminal the bar redraws in place; elsewhere (logs, CI, pipes) it prints a
line at most every ``interval`` seconds and one at the end, so long runs leave
a readable trace. Steps shorter than ``min_seconds`` print nothing. A resumed
job starts at ``done`` items; the rate counts only the items of this run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Progress of ``total`` items under a label.

    Example:
        >>> import io
        >>> stream = io.StringIO()
        >>> clock = iter([0.0, 30.0, 30.0]).__next__
        >>> bar = Progress(10, "zoo", done=2, unit="members", stream=stream, clock=clock)
        >>> bar.update(4)
        >>> stream.getvalue().splitlines()[-1]
        'zoo [##############----------]  6/10 members  8.0/min  ETA 0:30'
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        done: int = 0,
        unit: str = "",
        enabled: bool = True,
        stream: TextIO | None = None,
        min_seconds: float = 0.0,
        interval: float = 5.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total, self.label, self.unit = max(int(total), 0), label, unit
        self.done = self.start_done = done
        self.enabled, self.min_seconds, self.interval = enabled, min_seconds, interval
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.start = clock()
        self._last = -float("inf")
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Mark ``n`` more items done and redraw when due."""
        self.done += n
        now = self.clock()
        due = (now - self._last) >= (0.1 if self._tty else self.interval)
        if self.enabled and now - self.start >= self.min_seconds and due:
            self._draw(now - self.start, final=False)
            self._last = now

    def close(self) -> None:
        """Draw the final line (if the step took long enough to show)."""
        elapsed = self.clock() - self.start
        if self.enabled and elapsed >= self.min_seconds:
            self._draw(elapsed, final=True)

    def _draw(self, elapsed: float, final: bool) -> None:
        rate = (self.done - self.start_done) / max(elapsed, 1e-9)
        speed = f"{rate:.1f}/s" if rate >= 1 else f"{rate * 60:.1f}/min"
        if final:
            tail = f"{_clock(elapsed)} in all"
        else:
            tail = "ETA " + (_clock((self.total - self.done) / rate) if rate > 0 else "?")
        filled = round(24 * self.done / self.total) if self.total else 24
        bar = "#" * filled + "-" * (24 - filled)
        width = len(str(self.total))
        count = f"{self.done:>{width}}/{self.total}" + (f" {self.unit}" if self.unit else "")
        text = f"{self.label} [{bar}] {count}  {speed}  {tail}"
        end = "\n" if final or not self._tty else ""
        self.stream.write(("\r" if self._tty else "") + text + end)
        self.stream.flush()


def _clock(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``)."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
