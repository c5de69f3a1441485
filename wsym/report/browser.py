"""Open a report in headless Chromium: screenshot it and count the figures that rendered.

The report carries a tiny script that, once the page has loaded, writes onto
``<body>`` how many ``<img data-figure>`` decoded to a non-empty bitmap; Chromium's
``--dump-dom`` prints the page after its scripts ran, so the count comes from the
browser itself, not from parsing the file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from wsym.errors import WsymInputError

#: Flags for a sandboxed machine with no network (no background connections, no GPU).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)

#: Inline script the report embeds (see :class:`wsym.report.document.Document`).
COUNT_SCRIPT = (
    "<script>window.addEventListener('load',function(){var i=document.querySelectorAll"
    "('img[data-figure]'),n=0;i.forEach(function(e){if(e.complete&&e.naturalWidth>0)n++;});"
    "document.body.setAttribute('data-figures',i.length);"
    "document.body.setAttribute('data-rendered',n);});</script>"
)


def find_chromium() -> str | None:
    """Path of a Chromium executable, or ``None``."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def check(html: str | Path, screenshot: str | Path | None = None, timeout: float = 60) -> dict:
    """Render ``html`` headless; return ``{"figures": n, "rendered": m}`` and save a PNG.

    Raises:
        WsymInputError: no Chromium on this machine, or the page did not load.
    """
    chromium = find_chromium()
    if chromium is None:
        raise WsymInputError(
            "no Chromium found; install Debian's package: apt-get install chromium"
        )
    url = Path(html).resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile:
        base = [chromium, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000"]
        dom = subprocess.run(
            [*base, "--dump-dom", url], capture_output=True, text=True, timeout=timeout
        ).stdout
        if screenshot is not None:
            subprocess.run(
                [
                    *base,
                    f"--screenshot={Path(screenshot).resolve()}",
                    "--window-size=1100,4000",
                    url,
                ],
                capture_output=True,
                timeout=timeout,
            )
    found = re.search(r'<body[^>]*data-figures="(\d+)"[^>]*data-rendered="(\d+)"', dom)
    if found is None:
        raise WsymInputError(f"Chromium did not finish loading {html}")
    return {"figures": int(found.group(1)), "rendered": int(found.group(2))}
