"""``python -m gazette_consumer`` (the consumer image's entrypoint): run one consumer
application, named by ``--app`` (its shards live under ``<etcd.prefix>/<app>``) and defined
by the Python module ``--module``. Each flag falls back to an environment variable.

The consumer runtime does not exist yet (a later issue): for now the configuration is
checked (the application is named, its module imports) and the command exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from gazette.keyspace import CONSUMER_ROOT

NOT_IMPLEMENTED = "the consumer runtime is not implemented yet"


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name) or default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gazette_consumer",
        description="Run a Gazette consumer application.")
    parser.add_argument("--app", default=_env("CONSUMER_APP"),
                        help="application name: selects the etcd prefix "
                             "<etcd.prefix>/<app> [$CONSUMER_APP]")
    parser.add_argument("--module", default=_env("CONSUMER_MODULE"),
                        help="Python module defining the application [$CONSUMER_MODULE]")
    parser.add_argument("--etcd.address", dest="etcd_address",
                        default=_env("ETCD_ADDRESS", "http://localhost:2379"),
                        help="etcd endpoint [$ETCD_ADDRESS] (default: %(default)s)")
    parser.add_argument("--etcd.prefix", dest="etcd_prefix",
                        default=_env("CONSUMER_ETCD_PREFIX", CONSUMER_ROOT),
                        help="etcd prefix of consumer applications [$CONSUMER_ETCD_PREFIX] "
                             "(default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.app:
        parser.error("--app (or $CONSUMER_APP) is required: the application name")
    if "/" in args.app:
        parser.error(f"--app {args.app!r}: an application name has no '/'")
    if not args.module:
        parser.error("--module (or $CONSUMER_MODULE) is required: "
                     "the Python module defining the application")
    try:
        importlib.import_module(args.module)
    except ImportError as exc:
        parser.error(f"--module {args.module!r} (or $CONSUMER_MODULE) does not import: {exc}")
    prefix = f"{args.etcd_prefix.rstrip('/')}/{args.app}"
    print(f"gazette_consumer: {NOT_IMPLEMENTED} (application {args.app!r} at {prefix} "
          f"on {args.etcd_address}, module {args.module!r})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
