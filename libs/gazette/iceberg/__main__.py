"""``python -m gazette.iceberg compact|files``: compact a table's closed partitions (run
it from cron or a CronJob), or print its current data files (what ``spark.read.parquet``
reads where Spark has no Iceberg runtime). The table is given by flags or by the
``GAZETTE_ICEBERG_*`` variables the sink takes."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from sqlalchemy.exc import SQLAlchemyError

from gazette.errors import GazetteError
from gazette.iceberg.catalog import TableConfig
from gazette.iceberg.compact import compact, data_files


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gazette.iceberg", description=__doc__)
    parser.add_argument("command", choices=["compact", "files"])
    parser.add_argument("--catalog", default=os.environ.get("GAZETTE_ICEBERG_CATALOG"),
                        help="SQLAlchemy URL of the catalog [GAZETTE_ICEBERG_CATALOG]")
    parser.add_argument("--warehouse", default=os.environ.get("GAZETTE_ICEBERG_WAREHOUSE"),
                        help="file:///path or s3://bucket/prefix [GAZETTE_ICEBERG_WAREHOUSE]")
    parser.add_argument("--table", default=os.environ.get("GAZETTE_ICEBERG_TABLE"),
                        help="namespace.table [GAZETTE_ICEBERG_TABLE]")
    parser.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                        help="a catalog property (s3.endpoint=...), repeated "
                             "[GAZETTE_ICEBERG_PROPERTIES]")
    parser.add_argument("--min-files", type=int, default=8,
                        help="compact a partition with at least this many small files")
    parser.add_argument("--small-mib", type=int, default=32,
                        help="a file smaller than this many MiB is small")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = dict(os.environ)
    for name, value in (("CATALOG", args.catalog), ("WAREHOUSE", args.warehouse),
                        ("TABLE", args.table)):
        env[f"GAZETTE_ICEBERG_{name}"] = value or ""
    if args.property:
        env["GAZETTE_ICEBERG_PROPERTIES"] = ",".join(args.property)
    try:
        if args.min_files < 2 or args.small_mib < 1:
            raise GazetteError("--min-files must be at least 2 and --small-mib at least 1")
        config = TableConfig.from_env(env)
        table = config.catalog().load_table(config.identifier)
        if args.command == "files":
            print("\n".join(data_files(table)))
        else:
            replaced = compact(table, min_files=args.min_files,
                               small_bytes=args.small_mib << 20)
            print(f"compacted {config.identifier}: {replaced} files replaced")
    except (GazetteError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (NoSuchTableError, NoSuchNamespaceError, SQLAlchemyError, OSError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
