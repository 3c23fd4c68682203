"""The installed ``gazette`` command: ``gazette serve`` (a broker: `gazette_broker.cli`),
``gazette dev up`` (the local cluster: `gazette_dev.up`), which runs brokers and a
consumer member, so it is here, above both services, and ``gazette console`` (the web
console: `gazette.console.cli`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from gazette.console import cli as console_cli
from gazette_broker import cli as broker_cli
from gazette_dev.up import add_dev_parser


def add_subcommands(sub: Any) -> None:
    """``dev`` and ``console``, beside the broker's ``serve``."""
    add_dev_parser(sub)
    console_cli.add_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    return broker_cli.main(argv, more=add_subcommands)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
