"""``gazette console``: the console as a process (the installed ``gazette`` command adds
it, `gazette_dev.cli`; ``python -m gazette.console`` runs it alone). Every flag falls
back to its environment variable, then its default (`CONSOLE_OPTIONS`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from gazette.console.config import CONSOLE_OPTIONS, ConsoleConfig
from gazette.errors import ValidationError
from gazette.serving.options import LOG_OPTIONS, add_options, config_values, env_default

PROG = "gazette console"
DESCRIPTION = ("Serve the web console: journals, messages, shards, members and events "
               "dead letters of a cluster, as pages. Read-only unless --auth.token "
               "allows more. Every flag falls back to the environment variable in "
               "brackets.")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """``console`` under the subcommands `sub` of a command line."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "console", help="serve the web console", description=DESCRIPTION)
    port, *rest = CONSOLE_OPTIONS  # --port too, as the other commands' port flags
    parser.add_argument(port.flag, "--port", dest=port.field, type=port.type,
                        default=env_default(PROG, port.env, port.type, port.default),
                        help=f"{port.help} [${port.env}] (default: {port.default})")
    add_options(parser, PROG, [*rest, *LOG_OPTIONS])
    parser.set_defaults(run=run)
    return parser


def config_from_args(args: argparse.Namespace) -> ConsoleConfig:
    return ConsoleConfig(**config_values(args, CONSOLE_OPTIONS), env=dict(os.environ))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT (0); a bad flag is one line and 2."""
    import uvloop

    from gazette.console.server import Console
    from gazette.serving.process import serve_until_signalled, setup_logging

    setup_logging(args.log_level, args.log_format)
    try:
        console = Console(config_from_args(args))
    except ValidationError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    return int(uvloop.run(serve_until_signalled(console, "console")))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gazette")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["console", *(sys.argv[1:] if argv is None else argv)])
    return run(args)
