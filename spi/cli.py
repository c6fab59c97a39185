"""The ``dstl`` command line: storages, config, demo and the conformance runner.

Exit codes: 0 success, 1 a check or run failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .config import parse_key_values
from .errors import DstlError
from .options import ConfigOption
from .plugins import get_plugin_manager, get_registry

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: Columns of a table when stdout is not a terminal.
_PIPED_WIDTH = 250


def _version() -> str:
    try:
        return metadata.version("dstl")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _cmd_storages(args: argparse.Namespace, console: Console) -> int:
    registry = get_registry()
    if args.json:
        doc = {
            "storages": [
                {
                    "identifier": spec.identifier,
                    "distribution": spec.distribution,
                    "version": spec.version,
                    "capabilities": sorted(spec.capabilities),
                    "description": spec.description,
                }
                for spec in registry
            ],
            "broken": {name: str(error) for name, error in sorted(registry.broken.items())},
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return EXIT_FAILED if registry.broken else EXIT_OK
    table = Table(title="installed dstl storages")
    for column in ("identifier", "distribution", "version", "capabilities", "description"):
        table.add_column(column)
    for spec in registry:
        table.add_row(
            spec.identifier,
            spec.distribution,
            spec.version,
            ", ".join(sorted(spec.capabilities)) or "-",
            spec.description,
        )
    console.print(table)
    for name, error in sorted(registry.broken.items()):
        console.print(f"[red]plugin {name!r} failed to load[/red]: {error}")
    return EXIT_FAILED if registry.broken else EXIT_OK


_OPTION_COLUMNS = ("key", "type", "default", "storage", "description")


def _option_rows() -> list[tuple[str, ...]]:
    """One row per declared option, in key order (the storage that declares it, or -)."""
    registry = get_registry()
    owner = {opt.name: spec.identifier for spec in registry for opt in spec.options}
    return [
        (opt.name, opt.type_name, opt.default_text(), owner.get(opt.name, "-"), opt.full_doc + _aliases(opt))
        for opt in sorted(registry.options(), key=lambda o: o.name)
    ]


def _aliases(option: ConfigOption) -> str:
    return f" Also accepted as {', '.join(option.aliases)}." if option.aliases else ""


def config_markdown() -> str:
    """The option table as Markdown (the README's config section is this text)."""
    lines = ["| " + " | ".join(_OPTION_COLUMNS) + " |", "|---" * len(_OPTION_COLUMNS) + "|"]
    for cells in _option_rows():
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def update_readme(path: str) -> bool:
    """Rewrite the config table between the README's markers; True when it changed."""
    readme = Path(path)
    text = readme.read_text()
    start, end = "<!-- config-table:start -->\n", "<!-- config-table:end -->"
    head, sep, rest = text.partition(start)
    _, sep2, tail = rest.partition(end)
    if not (sep and sep2):
        msg = f"{path} lacks the markers {start.strip()} ... {end}"
        raise DstlError(msg)
    updated = head + start + config_markdown() + end + tail
    if updated != text:
        readme.write_text(updated)
    return updated != text


def _cmd_config(args: argparse.Namespace, console: Console) -> int:
    if args.update_readme:
        changed = update_readme(args.update_readme)
        console.print(f"{args.update_readme}: {'updated' if changed else 'already in sync'}")
        return EXIT_OK
    if args.markdown:
        sys.stdout.write(config_markdown())
        return EXIT_OK
    if args.json:
        rows = [dict(zip(_OPTION_COLUMNS, cells, strict=True)) for cells in _option_rows()]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    table = Table(title="dstl configuration options (in Spark: prefix with 'spark.')")
    for column in _OPTION_COLUMNS:
        table.add_column(column, overflow="fold")
    for cells in _option_rows():
        table.add_row(*cells)
    console.print(table)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dstl``."""
    parser = argparse.ArgumentParser(
        prog="dstl",
        description="Durable Short-Term Logs for state changelogs.",
    )
    parser.add_argument("--version", action="version", version=f"dstl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    storages = sub.add_parser("storages", help="list installed storages")
    storages.add_argument("--json", action="store_true", help="machine-readable output")
    storages.set_defaults(run=_cmd_storages)
    config = sub.add_parser("config", help="list every configuration option")
    config.add_argument("--markdown", action="store_true", help="print a Markdown table")
    config.add_argument("--json", action="store_true", help="machine-readable output")
    config.add_argument("--update-readme", metavar="PATH", help="rewrite the table in a README")
    config.set_defaults(run=_cmd_config)
    # commands of the packages above the SPI (demo, inspect, savepoint, conformance): their plugins
    get_plugin_manager().hook.dstl_cli_commands(subparsers=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dstl`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Piped output (grep, a file) is not cut at 80 columns: tables keep every cell whole.
    console = Console() if sys.stdout.isatty() else Console(width=_PIPED_WIDTH)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        args.config_values = parse_key_values(getattr(args, "config", []) or [])
        return int(args.run(args, console))
    except DstlError as exc:
        # the message may quote names from files someone else wrote: printed as text, not markup
        console.print(Text.assemble(("error: ", "red"), f"{type(exc).__name__}: {exc}"))
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED
    except BrokenPipeError:
        # the reader went away (| head): stop quietly, and keep Python's exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
