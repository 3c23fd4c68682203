"""Count the words of journals' lines.

    python -m gazette_spark.word_count --journals prefix=text/ --stores file:///data/ \\
        --output /tmp/counts [--field text]

A word is a maximal run of letters, digits and underscores (``\\w+``, Unicode), lower-cased:
the same rule as the word-count consumer, so both give equal counts for the same
journals: with ``--field text``, of the ``text`` field of the JSON messages, each
committed message once (read-committed), which is what the word-count consumer counts;
without, of the raw lines (read by the JVM: `gazette_spark.read`'s native path). Writes
``word,count`` as CSV (one file) to ``--output`` and logs the top ten.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from gazette_spark import cli

log = logging.getLogger("gazette_spark")
WORD = r"(?U)\w+"  # Java regex: (?U) makes \w Unicode, as Python's is
FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def run(argv: Sequence[str] | None = None) -> int:
    p = cli.parser("word_count", __doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="folder of the CSV result")
    p.add_argument("--field", default="", help="count the words of this string field of "
                   "JSON messages, each committed message once (as the word-count "
                   "consumer does: --field text), not of the raw lines")
    args = p.parse_args(argv)
    field = args.field.strip()
    if field and not FIELD.fullmatch(field):
        cli.usage_error(f"--field {field!r} is not a field name (letters, digits, _)")
    opts = cli.source_options(args, framing="lines") if not field else \
        cli.source_options(args, framing="json", readCommitted="true",
                           schema=f"`{field}` string")
    the_plan = cli.describe(cli.check(opts))
    spark = cli.session(args, "word_count")
    from pyspark.sql import functions as F

    import gazette_spark

    # (Lines: read by the JVM, the native path; messages: decoded and sequenced.)
    rows = gazette_spark.read(spark, **opts)
    text = F.col("value") if not field else F.col("data").getField(field)
    words = rows.select(F.explode(F.regexp_extract_all(
        F.lower(F.coalesce(text, F.lit(""))), F.lit(WORD), 0)).alias("word"))
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
