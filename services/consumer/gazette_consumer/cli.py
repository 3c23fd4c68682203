"""``gazette-consumer serve --app MODULE:ATTR`` (also ``python -m gazette_consumer
serve``): run one member of a consumer application.

``--app`` names the application: ``MODULE:ATTR`` is an `Application` instance (or a
class, made with no arguments) in an importable module (the working directory is on the
import path); ``MODULE`` alone means its attribute ``app``. Its shards and members live
under ``<etcd.prefix>/<app-name>`` (``--app-name`` defaults to the module's last part).
Every flag falls back to the environment variable in brackets. SIGTERM drains the member
(its shards move to others) and exits 0; a lost lease or a fatal task exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import uvloop

from gazette.consumer import Application
from gazette.consumer.member import ConsumerMember, MemberConfig
from gazette.errors import GazetteError, ValidationError
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

log = logging.getLogger("gazette_consumer")
PROG = "gazette-consumer"

#: ``--app``: the application to run (not a `MemberConfig` field).
APP_OPTION = Option("--app", "CONSUMER_MODULE", "app", str,
                    "the application, MODULE:ATTR (MODULE alone: its attribute app)")

#: The options of ``gazette-consumer serve`` that set the `MemberConfig` field they name,
#: each defaulting to that field's default.
SERVE_OPTIONS: tuple[Option, ...] = with_defaults(MemberConfig, [
    Option("--app-name", "CONSUMER_APP", "app_name", str,
           "the application's name: its shards and members live under --etcd.prefix, in "
           "a folder of this name", shown_default="the last part of --app's module"),
    *identity_options("consumer", "member"),
    Option("--consumer.http-port", "CONSUMER_HTTP_PORT", "http_port", int,
           "HTTP port of /metrics, /healthz and the application's routes (0: any free "
           "port; -1: no HTTP)"),
    Option("--consumer.limit", "CONSUMER_LIMIT", "shard_limit", int,
           "most shards this member takes"),
    *lease_options("consumer", "member", "shards"),
    Option("--consumer.local-dir", "CONSUMER_LOCAL_DIR", "local_dir", str,
           "folder of the stores of shards with recovery logs (played from their logs: "
           "nothing in it needs to survive the member)", shown_default="a temporary folder"),
    Option("--broker.address", "BROKER_ADDRESS", "broker_address", str,
           "a broker of the cluster the shards read and publish through"),
    *etcd_options("member"),
    Option("--etcd.prefix", "CONSUMER_ETCD_PREFIX", "etcd_root", str,
           "etcd prefix of consumer applications"),
    *SECURITY_OPTIONS,
])


class AppError(Exception):
    """--app does not name an application: the message says why."""


def load_app(spec: str) -> tuple[Application, str]:
    """The application ``MODULE[:ATTR]`` names, and its default name."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise AppError("--app is required: MODULE:ATTR of the application (or $CONSUMER_MODULE)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the app beside the caller
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise AppError(f"--app {spec!r}: module {module_name!r} does not import: "
                       f"{err}") from None
    attr = attr or "app"
    try:
        value: Any = getattr(module, attr)
    except AttributeError:
        raise AppError(f"--app {spec!r}: module {module_name!r} has no {attr!r}") from None
    if isinstance(value, type) and issubclass(value, Application):
        try:
            value = value()
        except GazetteError as err:  # (its configuration, from the environment, is bad)
            raise AppError(f"--app {spec!r}: {err}") from None
    if not isinstance(value, Application):
        raise AppError(f"--app {spec!r}: {attr!r} is a {type(value).__name__}, not a "
                       "gazette.consumer.Application (or a subclass of it)")
    return value, module_name.rsplit(".", 1)[-1].replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Gazette consumer applications.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a member of a consumer application",
                           description=__doc__.split("\n\n")[1].replace("\n", " "))
    add_options(serve, PROG, [APP_OPTION, *SERVE_OPTIONS, *LOG_OPTIONS])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        app, name = load_app(args.app)
    except AppError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    values = config_values(args, SERVE_OPTIONS)
    values.setdefault("app_name", name)
    try:
        config = MemberConfig(**values)
    except Exception as err:  # noqa: BLE001 - a bad value, named by its ValidationError
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    log.info("consumer configuration: %s", config)
    try:
        member = ConsumerMember(config, app)
    except ValidationError as err:  # its TLS files or keys
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    return uvloop.run(serve_until_signalled(member, "consumer member"))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
