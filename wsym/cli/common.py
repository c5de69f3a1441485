"""Pieces every ``wsym`` subcommand shares: exit codes and the subcommand parser."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_INPUT = 0, 1, 2


def add_command(commands: Any, name: str, summary: str, epilog: str) -> argparse.ArgumentParser:
    """Add subcommand ``name`` with a one-line ``summary`` and an ``epilog`` of examples.

    Args:
        commands: The object ``ArgumentParser.add_subparsers`` returned.
        name: The subcommand's name.
        summary: Lower-case summary, shown in ``wsym --help`` and as the description.
        epilog: Examples, printed verbatim after the options.

    Returns:
        The subcommand's parser, with ``--debug`` already added.
    """
    command = commands.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks"
    )
    return command


#: Runs estimated to take at least this long say so (and how long) before they start.
ANNOUNCE_SECONDS = 60.0


def announce(estimate: dict[str, float], stream: Any = None) -> None:
    """Say on stderr (or ``stream``) how long the run will take, if a minute or more."""
    total = sum(v for v in estimate.values() if v == v)
    if total < ANNOUNCE_SECONDS:
        return
    parts = ", ".join(
        f"{k} ~{v / 60:.1f} min" if v == v else f"{k} not estimated" for k, v in estimate.items()
    )
    print(
        f"this run is estimated to take up to ~{total / 60:.0f} min ({parts}); "
        "early stopping usually cuts the metanet's share",
        file=stream or sys.stderr,
        flush=True,
    )
