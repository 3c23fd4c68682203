"""What the jobs share: their command line, their SparkSession, and progress in the log.

Every job takes ``--journals`` and one of ``--broker`` / ``--stores`` (as the source's
options), ``--master`` (``local[*]`` by default; ``k8s://...`` on a cluster) and repeated
``--conf key=value`` for Spark. ``GAZETTE_BROKER_ADDRESS`` is the default of ``--broker``
when neither is given (the chart sets it in job pods).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from gazette.errors import GazetteError
from gazette_spark.options import ReadOptions
from gazette_spark.plan import Found, Plan, discover, persisted, plan, slices

log = logging.getLogger("gazette_spark")


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m gazette_spark.{prog}",
                                description=description)
    p.add_argument("--journals", default="", help="label selector of the journals "
                   "(e.g. 'prefix=events/'); all by default")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--broker", default="", help="a broker address: list fragments "
                       "through it (default: $GAZETTE_BROKER_ADDRESS)")
    where.add_argument("--stores", default="", help="comma-separated store URLs to list "
                       "directly (file:///abs/dir/, s3://bucket/prefix/)")
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[*]"),
                   help="Spark master (default local[*])")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting (repeatable)")
    p.add_argument("--progress-interval", type=float, default=10.0,
                   help="seconds between progress lines (default 10)")
    return p


def source_options(args: argparse.Namespace, **extra: str) -> dict[str, str]:
    """The ``gazette`` source's options for the job's arguments."""
    broker = args.broker or ("" if args.stores else os.environ.get(
        "GAZETTE_BROKER_ADDRESS", ""))
    if not broker and not args.stores:
        usage_error("give --broker ADDRESS or --stores URLS (or set GAZETTE_BROKER_ADDRESS)")
    opts = {"journals": args.journals, **extra}
    opts["broker" if broker else "stores"] = broker or args.stores
    return opts


def check(opts: dict[str, str], streaming: bool = False) -> ReadOptions:
    """The options parsed, or exit 2 with the error (before Spark starts)."""
    try:
        return ReadOptions.parse(opts, streaming=streaming)
    except GazetteError as err:
        usage_error(str(err))


def usage_error(message: str) -> NoReturn:
    """Exit 2 with one line, as argparse does for bad arguments."""
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


def warn_if_empty(found: Found, opts: ReadOptions) -> None:
    """Say when there is nothing to read: no journal matches, or those that match have
    no persisted fragment yet (naming them); journals without one are named too."""
    where = opts.broker or ", ".join(opts.stores)
    if not found:
        log.warning("no journal matches --journals %r in %s: nothing to read",
                    opts.selector.format(), where)
        return
    empty = sorted(j for j, fragments in persisted(found).items() if not fragments)
    if not empty:
        return
    names = ", ".join(empty[:20]) + (f" and {len(empty) - 20} more" if len(empty) > 20
                                     else "")
    if len(empty) == len(found):
        log.warning("%d journals match --journals %r in %s (%s), but none has a "
                    "persisted fragment yet: nothing to read (a broker persists a "
                    "fragment once it rolls its spool)", len(empty),
                    opts.selector.format(), where, names)
    else:
        log.info("journals with no persisted fragment yet (nothing of them is read): %s",
                 names)


def describe(opts: ReadOptions) -> Plan:
    """Plan the read on the driver, to log what it covers (the source plans again)."""
    found = asyncio.run(discover(opts))
    warn_if_empty(found, opts)
    the_plan = plan(found, opts)
    log.info("plan: %d journals, %d fragments, %.1f MiB, %d partitions",
             len(the_plan.pieces), the_plan.fragments, the_plan.size / (1 << 20),
             len(slices(the_plan, opts)))
    return the_plan


def session(args: argparse.Namespace, app: str) -> Any:
    """A SparkSession for the job, with the ``gazette`` source registered."""
    from pyspark.sql import SparkSession

    import gazette_spark
    from gazette_spark.native import NativeUnavailable, with_native

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(args.master).appName(f"gazette-{app}")
    try:  # (the native reader's jar on the session: gazette_spark.read's JVM path)
        builder = with_native(builder)
    except NativeUnavailable as err:
        log.info("%s: lines are read through the Python source: %s", app, err)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            usage_error(f"--conf {item!r} is not KEY=VALUE")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    gazette_spark.register(spark)
    return spark


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per closed connection


@contextmanager
def progress(spark: Any, the_plan: Plan | None, interval: float) -> Iterator[None]:
    """Log, every `interval` seconds, how many of the running stages' tasks are done
    and about how much of the plan that is."""
    done = threading.Event()
    started = time.monotonic()

    def report() -> None:
        tracker = spark.sparkContext.statusTracker()
        while not done.wait(interval):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is None or not info.numTasks:
                    continue
                part = info.numCompletedTasks / info.numTasks
                line = (f"progress: stage {stage_id}: {info.numCompletedTasks}/"
                        f"{info.numTasks} tasks")
                if the_plan is not None and the_plan.fragments:
                    line += (f", ~{round(part * the_plan.fragments)}/{the_plan.fragments} "
                             f"fragments, ~{part * the_plan.size / (1 << 20):.1f}/"
                             f"{the_plan.size / (1 << 20):.1f} MiB")
                log.info("%s (%.0fs)", line, time.monotonic() - started)

    thread = threading.Thread(target=report, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)


def main_guard(run: Any, argv: Sequence[str] | None) -> int:
    """Run a job: its errors end it with one line and a non-zero exit."""
    setup_logging()
    try:
        return int(run(argv) or 0)
    except GazetteError as err:
        log.error("%s", err)
        return 1
