"""The ``gazette`` command: ``gazette serve`` runs a broker (``gazette dev up``, the local
cluster, is in `gazette_broker.dev`).

Flags follow the Go broker's (``--broker.port``, ``--etcd.address``, ...), and each falls
back to an environment variable (``BROKER_PORT``, ``ETCD_ADDRESS``, ...), then a default.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop

from gazette.errors import ValidationError
from gazette.shell import (
    SECURITY_FLAGS,
    Flag,
    add_flags,
    config_values,
    serve_until_signalled,
    setup_logging,
)
from gazette_broker.server import BrokerConfig, BrokerServer

log = logging.getLogger("gazette_broker")

#: (flag, env variable, BrokerConfig field, type, help)
SERVE_FLAGS: list[Flag] = [
    ("--broker.zone", "BROKER_ZONE", "zone", str, "failure zone of this broker"),
    ("--broker.id", "BROKER_ID", "suffix", str,
     "unique name of this broker within its zone (default: host name and a random tag)"),
    ("--broker.host", "BROKER_HOST", "host", str,
     "host name other brokers and clients reach this broker at"),
    ("--broker.bind", "BROKER_BIND", "bind", str,
     "interface to listen on (default: all)"),
    ("--broker.port", "BROKER_PORT", "port", int, "gRPC port (0: any free port)"),
    ("--broker.http-port", "BROKER_HTTP_PORT", "http_port", int,
     "HTTP gateway port (0: any free port, -1: no gateway)"),
    ("--broker.file-root", "BROKER_FILE_ROOT", "file_root", Path,
     "root folder of file:/// fragment stores"),
    ("--broker.spool-dir", "BROKER_SPOOL_DIR", "spool_dir", Path,
     "folder for spools (default: a temporary folder)"),
    ("--broker.limit", "BROKER_LIMIT", "journal_limit", int,
     "most journals this broker takes"),
    ("--broker.max-append-size", "BROKER_MAX_APPEND_SIZE", "max_append_size", int,
     "largest append accepted, in bytes"),
    ("--broker.lease-ttl", "BROKER_LEASE_TTL", "lease_ttl", int,
     "seconds the member spec outlives a broker that died without cleaning up"),
    ("--broker.grace", "BROKER_GRACE", "grace", float,
     "seconds in-flight RPCs get to finish on shutdown"),
    ("--broker.drain-timeout", "BROKER_DRAIN_TIMEOUT", "drain_timeout", float,
     "seconds a stopping broker waits for its journals to move to other brokers"),
    ("--broker.append-idle-timeout", "BROKER_APPEND_IDLE_TIMEOUT", "append_idle_timeout",
     float, "seconds an append stream may bring no content before it is aborted "
     "(nothing written)"),
    ("--broker.cache-bytes", "BROKER_CACHE_BYTES", "cache_bytes", int,
     "bytes of persisted fragments cached on local disk for readers"),
    ("--broker.max-unpersisted-bytes", "BROKER_MAX_UNPERSISTED_BYTES",
     "max_unpersisted_bytes", int,
     "bytes of closed fragments that may wait for upload to one store; past it, appends "
     "to that store's journals wait, then are refused (FRAGMENT_STORE_UNHEALTHY)"),
    ("--etcd.address", "ETCD_ADDRESS", "etcd_address", str, "etcd endpoint"),
    ("--etcd.startup-timeout", "ETCD_STARTUP_TIMEOUT", "etcd_startup_timeout", float,
     "seconds a starting broker waits for etcd to answer (it retries meanwhile)"),
    ("--etcd.prefix", "ETCD_PREFIX", "etcd_prefix", str,
     "etcd prefix of the broker cluster"),
    *SECURITY_FLAGS,
]


#: The distribution whose version ``gazette --version`` shows (pyproject.toml's name).
DISTRIBUTION = "gazette-py"


def version() -> str:
    """The installed version; a source tree run without installing has no metadata."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gazette", description="Gazette for Python.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a broker",
                           description="Serve journals over gRPC and HTTP, persisting "
                           "fragments to their stores. Every flag falls back to the "
                           "environment variable in brackets.")
    add_flags(serve, "gazette", SERVE_FLAGS, BrokerConfig)

    from gazette_broker.dev import add_dev_parser
    add_dev_parser(sub)
    return parser


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    return BrokerConfig(**config_values(args, SERVE_FLAGS))


async def serve(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM/SIGINT (exit 0), or until its lease is lost or a task
    it cannot do without fails for good (exit 1: its supervisor restarts it)."""
    return await serve_until_signalled(BrokerServer(config), "broker")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
