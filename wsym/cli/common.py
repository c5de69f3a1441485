"""Pieces every ``wsym`` subcommand shares: exit codes and the subcommand parser."""

from __future__ import annotations

import argparse
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
