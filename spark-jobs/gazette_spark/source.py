"""The ``gazette`` PySpark data source: batch (``spark.read``) and streaming
(``spark.readStream``) reads of journal fragments.

The driver lists journals and fragments and plans slices (`plan`); executors read them
(`read`). Options are parsed once, when the source is created, so a bad one fails the
query at once with its name. Filter pushdown is not used (measured: the Python Data
Source API returned stale results when a pushed-down reader was reused): pruning is given
as options (journals, offsets, times).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from gazette_spark import plan as planning
from gazette_spark.options import EARLIEST, LATEST, Offsets, ReadOptions
from gazette_spark.read import SliceReader

log = logging.getLogger("gazette_spark")

_UUID_COLUMNS = "uuid string, producer string, clock bigint, flags int"


def schema_ddl(opts: ReadOptions) -> str:
    """The rows' schema: where each message is, its value, its UUID's parts (framings
    that carry them) and, for json with a schema, its parsed ``data``."""
    value = "binary" if opts.framing == "fixed" else "string"
    ddl = f"journal string, offset bigint, value {value}"
    if opts.has_uuids:
        ddl += ", " + _UUID_COLUMNS
    if opts.json_schema:
        ddl += f", data struct<{opts.json_schema}>"
    return ddl


class SlicePartition(InputPartition):
    """A `plan.Slice` as Spark's input partition."""

    def __init__(self, value: planning.Slice) -> None:
        super().__init__(value)


def _plan(opts: ReadOptions, starts: dict[str, int] | None = None,
          found: planning.Found | None = None
          ) -> tuple[planning.Plan, list[planning.Slice]]:
    if found is None:
        found = asyncio.run(planning.discover(opts))
    the_plan = planning.plan(found, opts, starts)
    slices = planning.slices(the_plan, opts)
    log.info("gazette: %d journals, %d fragments, %.1f MiB to read in %d partitions",
             len(the_plan.pieces), the_plan.fragments, the_plan.size / (1 << 20),
             len(slices))
    return the_plan, slices


def _read(partition: InputPartition, opts: ReadOptions, schema: StructType
          ) -> Iterator[pa.RecordBatch]:
    the_slice: planning.Slice | None = getattr(partition, "value", None)
    if the_slice is None:  # Spark's one partition of a read that plans none
        return iter(())
    return SliceReader(the_slice, opts, to_arrow_schema(schema)).batches()


class GazetteDataSource(DataSource):
    """``spark.read.format("gazette")``; see docs/spark.md for the options."""

    @classmethod
    def name(cls) -> str:
        return "gazette"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._options = dict(options)

    def schema(self) -> str:
        return schema_ddl(ReadOptions.parse(self._options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return GazetteReader(ReadOptions.parse(self._options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GazetteStreamReader(ReadOptions.parse(self._options, streaming=True), schema)


class GazetteReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts, self.schema = opts, schema

    def partitions(self) -> list[InputPartition]:
        _, slices = _plan(self.opts)
        return [SlicePartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.opts, self.schema)


class GazetteStreamReader(DataSourceStreamReader):
    """Offsets are ``{journal: offset}``: a micro-batch reads each journal from the last
    batch's offset to the end of its persisted fragments now. Journals that appear later
    are read from their earliest fragment."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts, self.schema = opts, schema
        #: The listing `latestOffset` made, for the `partitions` call that follows it
        #: (one listing per micro-batch, not two).
        self._found: planning.Found | None = None

    def initialOffset(self) -> dict[str, Any]:
        the_plan, _ = _plan(self.opts)
        return dict(the_plan.starts)

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: Any = None) -> dict[str, Any]:
        found = self._found = asyncio.run(planning.discover(self.opts))
        the_plan = planning.plan(found, _unbounded(self.opts), start or {})
        latest = dict(start or {})
        latest.update(the_plan.ends)
        return latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[InputPartition]:
        opts = _ending_at(_unbounded(self.opts), end)
        found, self._found = self._found, None
        _, slices = _plan(opts, {j: int(o) for j, o in start.items()}, found)
        return [SlicePartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.opts, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        pass


def _unbounded(opts: ReadOptions) -> ReadOptions:
    """Journals a stream did not know yet are read from their earliest fragment."""
    return replace(opts, starting=Offsets(EARLIEST, opts.starting.by_journal))


def _ending_at(opts: ReadOptions, end: dict[str, Any]) -> ReadOptions:
    return replace(opts, ending=Offsets(LATEST, {j: int(o) for j, o in end.items()}))
