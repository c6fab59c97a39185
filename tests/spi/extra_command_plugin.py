"""A plugin module loaded through DSTL_PLUGINS that adds a ``dstl`` subcommand."""

from dstl.spi import hookimpl


def _greet(args, console):
    console.print(f"hello {args.name}")
    return 0


@hookimpl
def dstl_cli_commands(subparsers):
    hello = subparsers.add_parser("hello", help="say hello")
    hello.add_argument("name")
    hello.set_defaults(run=_greet)
