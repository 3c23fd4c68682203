"""Compaction: a partition's many small files (a snapshot a transaction makes one a
partition) rewritten as one, and what Spark reads of a table without the Iceberg runtime.

A partition's rows (the predicate of its ``_published`` range) are written once as a
new file, and swapped for the old files in a commit based on a snapshot in which the
partition holds exactly those old files: the catalog refuses the commit if any other
landed since, and then the store checks the partition again on the table as it is now
(other shards' appends elsewhere do not matter) and commits again; if rows came to the
partition meanwhile, it is read again. So rows a shard appends during a compaction are
never lost, and a busy table does not starve it. Only closed partitions (ended a
partition's length ago, by default) are compacted, where shards rarely append.
pyiceberg's writer of data files (``_dataframe_to_data_files``, what its ``append``
uses) writes the new file.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import defaultdict
from typing import Any

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.table import Table

from gazette.iceberg import metrics
from gazette.iceberg.catalog import CONFLICTS

log = logging.getLogger(__name__)

_UNIT_SECONDS = {"hour": 3600, "day": 86400}


def data_files(table: Table) -> list[str]:
    """The data files of the table's current snapshot (what ``spark.read.parquet``
    reads where Spark has no Iceberg runtime: no delete files are ever written here)."""
    table.refresh()
    return [task.file.file_path for task in table.scan().plan_files()]


def compact(table: Table, *, min_files: int = 8, small_bytes: int = 32 << 20,
            max_bytes: int = 512 << 20, before: float | None = None,
            attempts: int = 5) -> int:
    """Rewrite each closed partition (ended before `before`; by default, at least a
    partition's length ago) holding at least `min_files` files smaller than
    `small_bytes`, and no more than `max_bytes` in all, as one file; returns how many
    files were replaced."""
    table.refresh()
    spec = table.spec()
    unit = spec.fields[0].name.rsplit("_", 1)[-1] if spec.fields else "none"
    before = time.time() - _UNIT_SECONDS.get(unit, 31 * 86400) if before is None else before
    replaced = 0
    for key, (count, size) in sorted(_partitions(table, small_bytes).items(),
                                     key=lambda kv: (kv[0] is None, kv[0] or 0)):
        if count < min_files or size > max_bytes:
            continue
        where = _predicate(unit, key)
        if where is None or (key is not None and _end_of(unit, key) > before):
            continue
        done = _rewrite(table, where, attempts)
        if not done:
            log.warning("compaction of %s=%s gave up after %d conflicts", unit, key,
                        attempts)
        replaced += done
        metrics.COMPACTED_FILES.inc(done)
    return replaced


def _rewrite(table: Table, where: BooleanExpression, attempts: int) -> int:
    """Replace the files of the partition `where` selects by one file of their rows. The
    new file is written once; each attempt checks, on the table as it is now, that the
    partition still has exactly those files (else it is read again: rows came), and
    commits the swap on that snapshot. Returns how many files it replaced (0: it gave
    up)."""
    for _ in range(attempts):
        table.refresh()
        old = [task.file for task in table.scan(row_filter=where).plan_files()]
        rows = table.scan(row_filter=where).to_arrow()
        new = list(_dataframe_to_data_files(table.metadata, rows, table.io))
        paths = {f.file_path for f in old}
        for _ in range(attempts * 4):
            current = [task.file for task in table.scan(row_filter=where).plan_files()]
            if {f.file_path for f in current} != paths:
                break  # rows came to the partition: read it again
            try:
                tx = table.transaction()
                with tx.update_snapshot(snapshot_properties={
                        "gazette.compacted": str(len(current))}).overwrite() as swap:
                    for f in current:
                        swap.delete_data_file(f)
                    for f in new:
                        swap.append_data_file(f)
                tx.commit_transaction()
                return len(current)
            except CONFLICTS:
                metrics.CONFLICTS.inc()
                table.refresh()
    return 0


def _partitions(table: Table, small_bytes: int) -> dict[Any, tuple[int, int]]:
    """Partition value -> (its files smaller than `small_bytes`, all its files' bytes)."""
    out: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
    for task in table.scan().plan_files():
        f = task.file
        key = f.partition[0] if len(f.partition) else None
        out[key][0] += f.file_size_in_bytes < small_bytes
        out[key][1] += f.file_size_in_bytes
    return {k: (c, s) for k, (c, s) in out.items()}


def _start_of(unit: str, key: int) -> dt.datetime:
    if unit == "month":
        return dt.datetime(1970 + key // 12, key % 12 + 1, 1, tzinfo=dt.UTC)
    return dt.datetime.fromtimestamp(key * _UNIT_SECONDS[unit], dt.UTC)


def _end_of(unit: str, key: int) -> float:
    return _start_of(unit, key + 1).timestamp()


def _predicate(unit: str, key: int | None) -> BooleanExpression | None:
    """The rows of partition `key` (None: the rows without a time, or the whole table
    unpartitioned)."""
    if unit == "none":
        return AlwaysTrue()
    if key is None:
        return parse("_published is null")
    if unit not in ("hour", "day", "month"):
        return None
    start, end = _start_of(unit, key), _start_of(unit, key + 1)
    return parse(f"_published >= '{start.isoformat()}' and "
                 f"_published < '{end.isoformat()}'")
