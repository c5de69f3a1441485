"""Progress bars on stderr: tqdm, with wsym's defaults.

On a terminal the bar redraws in place; elsewhere (logs, CI, pipes) it redraws at
most every ``interval`` seconds, so long runs leave a readable trace. Steps shorter
than ``min_seconds`` print nothing. A resumed job starts at ``done`` items (tqdm's
``initial``: the rate counts only the items of this run). tqdm's own controls apply
(``TQDM_DISABLE=1`` silences every bar, ``TQDM_MININTERVAL`` and friends).
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


def Progress(  # noqa: N802 (the bar is a class to its users: with Progress(...) as bar)
    total: int,
    label: str,
    *,
    done: int = 0,
    unit: str = "",
    enabled: bool = True,
    stream: TextIO | None = None,
    min_seconds: float = 0.0,
    interval: float = 5.0,
) -> tqdm:
    """A tqdm bar of ``total`` items under ``label``.

    Example:
        >>> import io
        >>> stream = io.StringIO()
        >>> with Progress(10, "zoo", done=2, unit="members", stream=stream) as bar:
        ...     bar.update(4)
        >>> stream.getvalue().splitlines()[-1].split("|")[-1].split("[")[0].strip()
        '6/10 members'
    """
    stream = sys.stderr if stream is None else stream
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return tqdm(
        total=max(int(total), 0),
        initial=done,
        desc=label,
        unit=unit or "it",
        file=stream,
        disable=not enabled,
        delay=min_seconds,
        mininterval=0.1 if tty else interval,
        bar_format="{desc} {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt} "
        + (unit or "")
        + " [{elapsed}<{remaining}, {rate_fmt}]",
        dynamic_ncols=tty,
    )
