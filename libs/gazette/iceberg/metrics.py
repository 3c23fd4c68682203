"""Prometheus metrics of tables fed from journals (served by the member's ``/metrics``)."""

from prometheus_client import Counter, Histogram

ROWS = Counter("gazette_iceberg_rows_total", "Rows committed to Iceberg tables")
COMMIT_SECONDS = Histogram("gazette_iceberg_commit_seconds",
                           "Seconds of one transaction's commit to its table (conflicts "
                           "and retries included)",
                           buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
CONFLICTS = Counter("gazette_iceberg_commit_conflicts_total",
                    "Commits retried because another writer committed first")
FENCED = Counter("gazette_iceberg_fenced_total",
                 "Commits refused: the shard was restored by another process since")
BAD_VALUES = Counter("gazette_iceberg_bad_values_total",
                     "Values that did not fit their column, stored as null "
                     "(bad_values='null')")
COMPACTED_FILES = Counter("gazette_iceberg_compacted_files_total",
                          "Small data files replaced by compaction")
