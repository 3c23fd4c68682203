"""Export journals to Parquet, partitioned by journal and date, incrementally.

    python -m gazette_spark.export --journals prefix=events/ --stores s3://bucket/ \\
        --output s3a://lake/events/ [--framing json]

Each run exports what was persisted since the last one and stops: it is the streaming
source run once (``availableNow``) into Parquet, and its checkpoint (``<output>/_checkpoint``
unless ``--checkpoint``) holds the offsets each journal was exported through, so a run
that fails is repeated without duplicates and one that succeeds is never exported again.
``date`` is the UTC day of the message's UUID clock for framings that carry UUIDs, else
the day of the run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gazette_spark import cli

log = logging.getLogger("gazette_spark")
#: 100 ns ticks between the UUID epoch (1582-10-15) and the Unix epoch.
_GREGORIAN_OFFSET = 0x01B21DD213814000


def run(argv: Sequence[str] | None = None) -> int:
    p = cli.parser("export", __doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="Parquet folder (file path, s3a://...)")
    p.add_argument("--checkpoint", default="", help="default: <output>/_checkpoint")
    p.add_argument("--framing", default="lines", help="lines (default), json, csv, fixed")
    p.add_argument("--timeout", type=float, default=0,
                   help="give up after this many seconds (0: no limit)")
    args = p.parse_args(argv)
    opts = cli.source_options(args, framing=args.framing)
    parsed = cli.check(opts, streaming=True)
    spark = cli.session(args, "export")
    from pyspark.sql import functions as F

    df = spark.readStream.format("gazette").options(**opts).load()
    if parsed.has_uuids:
        seconds = (F.col("clock").cast("decimal(38,0)") / 16 - _GREGORIAN_OFFSET) / 10**7
        day = F.to_date(F.from_unixtime(seconds.cast("bigint")))
        df = df.withColumn("date", F.coalesce(day, F.current_date()))
    else:
        df = df.withColumn("date", F.current_date())
    checkpoint = args.checkpoint or args.output.rstrip("/") + "/_checkpoint"
    query = (df.writeStream.format("parquet").option("path", args.output)
             .option("checkpointLocation", checkpoint).partitionBy("journal", "date")
             .trigger(availableNow=True).start())
    with cli.progress(spark, None, args.progress_interval):
        finished = query.awaitTermination(args.timeout or None)
    if finished is False:
        query.stop()
        log.error("export: not done after %gs; stopped (the next run resumes)", args.timeout)
        return 1
    if query.exception() is not None:
        log.error("export failed: %s", query.exception())
        return 1
    rows = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    log.info("export: %d rows written to %s (offsets in %s)", rows, args.output, checkpoint)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main_guard(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
