"""The installed ``gazette`` command: ``gazette serve`` (a broker: `gazette_broker.cli`)
and ``gazette dev up`` (the local cluster: `gazette_dev.up`), which runs brokers and a
consumer member, so it is here, above both services."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

from gazette_broker import cli as broker_cli
from gazette_dev.up import add_dev_parser


def main(argv: Sequence[str] | None = None) -> int:
    return broker_cli.main(argv, more=add_dev_parser)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
