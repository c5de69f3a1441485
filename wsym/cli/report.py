"""``wsym report``: the main job, every capability of wsym run on one zoo.

Loads the zoo, runs :func:`wsym.report.report` and writes ``report.html`` (figures
embedded) and ``report.json`` into ``--out``; with ``--screenshot`` it also opens
the page in headless Chromium, saves ``screenshot.png`` and checks that every
figure rendered.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from wsym.cli.common import EXIT_ERROR, EXIT_OK, add_command
from wsym.errors import WsymInputError
from wsym.io.resources import ZOOS

#: The zoo the main job runs on when ``--zoo`` is not given (shipped in ``data/``).
DEFAULT_ZOO = ZOOS / "mnist1d-mlp"

_EXAMPLE = f"""\
examples:
  wsym report --out wsym-report                  # the default zoo ({DEFAULT_ZOO.name})
  wsym report --zoo my-zoo/ --out my-report --seed 1 --json
  wsym report --out wsym-report --screenshot     # also check it in headless Chromium
"""


def add_command_to(commands: Any) -> None:
    """Add ``report`` to the ``wsym`` parser."""
    parser = add_command(commands, "report", "write the HTML report of a zoo", _EXAMPLE)
    parser.add_argument(
        "--zoo", default=str(DEFAULT_ZOO), metavar="DIR", help="zoo folder (default: shipped)"
    )
    parser.add_argument("--out", default="wsym-report", metavar="DIR", help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument("--quick", action="store_true", help="a smoke run on fewer members")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument(
        "--metanet", metavar="FILE", help="meta-network to evaluate (default: the shipped one)"
    )
    parser.add_argument(
        "--screenshot", action="store_true", help="render in headless Chromium and check figures"
    )
    parser.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    """``wsym report``: write the report, print where it is (or its numbers as JSON)."""
    import wsym.report
    from wsym.report import browser

    zoo = _load_zoo(args.zoo)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise WsymInputError(f"--out {out} is a file; give a folder for the report")
    if args.screenshot and browser.find_chromium() is None:
        raise WsymInputError("--screenshot needs Chromium: apt-get install chromium")
    numbers = wsym.report.report(zoo, out, seed=args.seed, quick=args.quick, metanet=args.metanet)
    if args.screenshot:
        shown = browser.check(out / "report.html", out / "screenshot.png")
        numbers["browser"] = shown
        if shown["rendered"] != shown["figures"]:
            print(f"wsym: error: only {shown['rendered']} of {shown['figures']} figures rendered")
            return EXIT_ERROR
    if args.json:
        print(json.dumps(numbers, default=float))
    else:
        print(f"report written to {(out / 'report.html').resolve()}")
    return EXIT_OK


def _load_zoo(path: str) -> Any:
    import wsym.zoo

    if not Path(path).is_dir():
        raise WsymInputError(
            f"no zoo at {path}; build one with: wsym zoo build --preset mnist1d-mlp --out {path}"
        )
    return wsym.zoo.load(path)
