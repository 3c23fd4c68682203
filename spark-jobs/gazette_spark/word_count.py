"""Count the words of journals' lines.

    python -m gazette_spark.word_count --journals prefix=text/ --stores file:///data/ \\
        --output /tmp/counts

A word is a maximal run of letters, digits and underscores (``\\w+``, Unicode), lower-cased:
the same rule as the word-count consumer, so both give equal counts for the same
journals. The lines are read by the JVM (`gazette_spark.read`). Writes ``word,count``
as CSV (one file) to ``--output`` and logs the top ten.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gazette_spark import cli

log = logging.getLogger("gazette_spark")
WORD = r"(?U)\w+"  # Java regex: (?U) makes \w Unicode, as Python's is


def run(argv: Sequence[str] | None = None) -> int:
    p = cli.parser("word_count", __doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="folder of the CSV result")
    args = p.parse_args(argv)
    opts = cli.source_options(args, framing="lines")
    the_plan = cli.describe(cli.check(opts))
    spark = cli.session(args, "word_count")
    from pyspark.sql import functions as F

    import gazette_spark

    lines = gazette_spark.read(spark, **opts)  # (the JVM reads lines: the native path)
    words = lines.select(F.explode(F.regexp_extract_all(
        F.lower("value"), F.lit(WORD), 0)).alias("word"))
    counts = words.groupBy("word").count().orderBy(F.desc("count"), "word")
    with cli.progress(spark, the_plan, args.progress_interval):
        counts.coalesce(1).write.mode("overwrite").option("header", "true").csv(args.output)
        top = counts.limit(10).collect()
    log.info("word_count: top words: %s", ", ".join(f"{r['word']}={r['count']}" for r in top))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main_guard(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
