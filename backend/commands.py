"""The backend's ``dstl`` subcommands: ``demo`` (the main job), ``inspect`` and ``savepoint``."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from dstl.spi import hookimpl

__all__ = ["dstl_cli_commands"]


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from .spark.demo import run_demo  # the main job lives with the Spark integration

    return run_demo(args, console)


@hookimpl
def dstl_cli_commands(subparsers: Any) -> None:
    """Add ``demo``, ``inspect`` and ``savepoint``."""
    from .tools.inspect_command import add_inspect_parser, add_savepoint_parser

    demo = subparsers.add_parser(
        "demo", help="run the main job: a PySpark streaming pipeline on the changelog backend"
    )
    demo.add_argument("--storage", help="storage identifier (default: dstl.storage)")
    demo.add_argument("--seconds", type=float, default=10.0, help="bounded run time")
    demo.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    demo.add_argument(
        "--verify", action="store_true", help="kill and restart the job mid-stream, then check it: PASS/FAIL"
    )
    demo.add_argument("--workdir", help="keep input, output and checkpoints here (default: a temp dir)")
    demo.add_argument(
        "--progress", metavar="FILE", help="write each batch's progress as one JSON object per line"
    )
    demo.set_defaults(run=_cmd_demo)
    add_inspect_parser(subparsers)
    add_savepoint_parser(subparsers)
