"""The ``dstl conformance`` subcommand."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from dstl.spi import hookimpl

__all__ = ["add_conformance_parser", "dstl_cli_commands"]


def _run(args: argparse.Namespace, console: Console) -> int:
    from ._private.runner import run_conformance

    return run_conformance(
        args.storage,
        args.config_values,
        junitxml=args.junitxml,
        keyword=args.k,
        plugins=args.plugin,
        exitfirst=args.exitfirst,
        verbose=args.verbose,
        console=console,
    )


def add_conformance_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``conformance`` to the ``dstl`` command."""
    parser = subparsers.add_parser("conformance", help="run the conformance suite against a storage")
    parser.add_argument("storage", help="identifier of an installed storage")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--junitxml", metavar="PATH", help="write a JUnit XML report")
    parser.add_argument("-k", metavar="EXPR", help="only tests matching the pytest expression")
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE", help="extra plugin module to load"
    )
    parser.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.set_defaults(run=_run)


@hookimpl
def dstl_cli_commands(subparsers: Any) -> None:
    """Add ``conformance``."""
    add_conformance_parser(subparsers)
