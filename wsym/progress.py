"""A dependency-free progress bar on stderr: items done, rate, ETA.

On a terminal the bar redraws in place; elsewhere (logs, CI, pipes) it prints a
line at most every ``interval`` seconds and one at the end, so long runs leave
a readable trace. Steps shorter than ``min_seconds`` print nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Progress of ``total`` items under a label.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with Progress(3, "members", stream=out, min_seconds=0) as bar:
        ...     for _ in range(3):
        ...         bar.update()
        >>> "3/3" in out.getvalue()
        True
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        min_seconds: float = 1.0,
        interval: float = 5.0,
    ) -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.min_seconds = min_seconds
        self.interval = interval
        self.done = 0
        self._start = time.perf_counter()
        self._last = -float("inf")
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Mark ``n`` more items done and redraw when due."""
        self.done += n
        now = time.perf_counter()
        elapsed = now - self._start
        due = (now - self._last) >= (0.1 if self._tty else self.interval)
        if self.enabled and elapsed >= self.min_seconds and due:
            self._draw(elapsed, final=False)
            self._last = now

    def close(self) -> None:
        """Draw the final line (if the step took long enough to show)."""
        elapsed = time.perf_counter() - self._start
        if self.enabled and elapsed >= self.min_seconds:
            self._draw(elapsed, final=True)

    def _draw(self, elapsed: float, final: bool) -> None:
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        eta = f"{elapsed:.0f}s" if final else f"ETA {left:.0f}s"
        text = f"{self.label:<22s} [{bar}] {self.done}/{self.total}  {rate:.1f}/s  {eta}"
        end = "\n" if final or not self._tty else ""
        self.stream.write(("\r" if self._tty else "") + text + end)
        self.stream.flush()
