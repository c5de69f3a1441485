"""A one-line progress bar on stderr: members done, rate and time left.

Example:
    >>> import io
    >>> stream = io.StringIO()
    >>> clock = iter([0.0, 0.0, 30.0]).__next__
    >>> bar = Progress(10, done=2, stream=stream, label="zoo", clock=clock)
    >>> bar.update(4)
    >>> stream.getvalue().splitlines()[-1]
    'zoo [############--------]  6/10 members   8.0/min  ETA 0:30'
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Members done out of ``total`` (``done`` already there), rate, ETA; redrawn on update.

    On a terminal the line is redrawn in place (carriage return); elsewhere each update
    prints a new line.
    """

    def __init__(
        self,
        total: int,
        done: int = 0,
        *,
        enabled: bool = True,
        label: str = "zoo",
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.start_done, self.done = total, done, done
        self.enabled, self.label = enabled, label
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.start = clock()
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        if enabled and done:
            self._draw()

    def update(self, members: int) -> None:
        """Record ``members`` more finished members and redraw."""
        self.done += members
        if self.enabled:
            self._draw()

    def close(self) -> None:
        """End the line on a terminal."""
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        elapsed = max(self.clock() - self.start, 1e-9)
        new = self.done - self.start_done
        rate = new / elapsed * 60
        filled = round(20 * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (20 - filled)
        eta = _clock_time((self.total - self.done) / rate * 60) if rate > 0 else "?"
        width = len(str(self.total))
        line = (
            f"{self.label} [{bar}] {self.done:>{width}}/{self.total} members "
            f"{rate:5.1f}/min  ETA {eta}"
        )
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()


def _clock_time(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
