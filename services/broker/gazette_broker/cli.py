"""The ``gazette`` command's broker: ``gazette serve`` runs a broker (the installed
``gazette`` command adds ``gazette dev up``, the local cluster: `gazette_dev.cli`).

Flags follow the Go broker's (``--broker.port``, ``--etcd.address``, ...), and each falls
back to an environment variable (``BROKER_PORT``, ``ETCD_ADDRESS``, ...), then a default:
`SERVE_OPTIONS` describes each once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvloop

from gazette.errors import ValidationError
from gazette.serving.options import (
    LOG_OPTIONS,
    SECURITY_OPTIONS,
    Option,
    add_options,
    config_values,
    etcd_options,
    identity_options,
    lease_options,
    with_defaults,
)
from gazette.serving.process import serve_until_signalled, setup_logging
from gazette_broker.server import BrokerConfig, BrokerServer

log = logging.getLogger("gazette_broker")

#: The options of ``gazette serve``: each sets the `BrokerConfig` field it names, and
#: defaults to that field's default.
SERVE_OPTIONS: tuple[Option, ...] = with_defaults(BrokerConfig, [
    *identity_options("broker", "broker"),
    Option("--broker.http-port", "BROKER_HTTP_PORT", "http_port", int,
           "HTTP gateway port (0: any free port, -1: no gateway)"),
    Option("--broker.data-port", "BROKER_DATA_PORT", "data_port", int,
           "data path port: appends pipelined on one connection, beside gRPC (0: any "
           "free port, -1: none; clients then append by gRPC)"),
    Option("--broker.file-root", "BROKER_FILE_ROOT", "file_root", Path,
           "root folder of file:/// fragment stores (none: file stores are refused)"),
    Option("--broker.spool-dir", "BROKER_SPOOL_DIR", "spool_dir", Path,
           "folder for spools", shown_default="a temporary folder"),
    Option("--broker.limit", "BROKER_LIMIT", "journal_limit", int,
           "most journals this broker takes"),
    Option("--broker.max-append-size", "BROKER_MAX_APPEND_SIZE", "max_append_size", int,
           "largest append accepted, in bytes"),
    *lease_options("broker", "broker", "journals"),
    Option("--broker.grace", "BROKER_GRACE", "grace", float,
           "seconds in-flight RPCs get to finish on shutdown"),
    Option("--broker.append-idle-timeout", "BROKER_APPEND_IDLE_TIMEOUT",
           "append_idle_timeout", float, "seconds an append stream may bring no content "
           "before it is aborted (nothing written); it holds its journal meanwhile"),
    Option("--broker.cache-bytes", "BROKER_CACHE_BYTES", "cache_bytes", int,
           "bytes of persisted fragments cached on local disk for readers, one budget for "
           "all journals"),
    Option("--broker.max-unpersisted-bytes", "BROKER_MAX_UNPERSISTED_BYTES",
           "max_unpersisted_bytes", int,
           "bytes of closed fragments that may wait for upload to one store; past it, "
           "appends to that store's journals wait, then are refused "
           "(FRAGMENT_STORE_UNHEALTHY)"),
    *etcd_options("broker"),
    Option("--etcd.prefix", "ETCD_PREFIX", "etcd_prefix", str,
           "etcd prefix of the broker cluster"),
    *SECURITY_OPTIONS,
])


#: The distribution whose version ``gazette --version`` shows (pyproject.toml's name).
DISTRIBUTION = "gazette-py"


def version() -> str:
    """The installed version; a source tree run without installing has no metadata."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(more: Callable[[Any], None] | None = None) -> argparse.ArgumentParser:
    """``gazette serve``, and the subcommands `more` adds (``gazette dev``)."""
    parser = argparse.ArgumentParser(prog="gazette", description="Gazette for Python.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a broker",
                           description="Serve journals over gRPC and HTTP, persisting "
                           "fragments to their stores. Every flag falls back to the "
                           "environment variable in brackets.")
    add_options(serve, "gazette", [*SERVE_OPTIONS, *LOG_OPTIONS])
    if more is not None:
        more(sub)
    return parser


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    return BrokerConfig(**config_values(args, SERVE_OPTIONS))


async def serve(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM/SIGINT (exit 0), or until its lease is lost or a task
    it cannot do without fails for good (exit 1: its supervisor restarts it)."""
    return await serve_until_signalled(BrokerServer(config), "broker")


def main(argv: Sequence[str] | None = None,
         more: Callable[[Any], None] | None = None) -> int:
    """The command; `more` adds subcommands (each sets ``run``: what it does)."""
    args = build_parser(more).parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    if args.command == "serve":
        config = config_from_args(args)
        log.info("broker configuration: %s", config)
        try:
            server = BrokerServer(config)
        except ValidationError as err:  # its TLS files or keys
            print(f"gazette serve: {err}", file=sys.stderr)
            return 2
        return uvloop.run(serve_until_signalled(server, "broker"))
    return int(args.run(args))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
