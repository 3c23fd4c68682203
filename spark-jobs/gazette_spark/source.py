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
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from gazette.errors import ValidationError
from gazette_spark import plan as planning
from gazette_spark import stream_state
from gazette_spark.options import EARLIEST, LATEST, Offsets, ReadOptions
from gazette_spark.slices import SliceReader

log = logging.getLogger("gazette_spark")

_UUID_COLUMNS = {"uuid": "string", "producer": "string", "clock": "bigint", "flags": "int"}


class SchemaError(ValidationError):
    """A reader schema (``spark.read.format("gazette").schema(...)``) the framing cannot
    fill; refused when the read is planned, not as a worker's crash."""

    def __init__(self, reason: str) -> None:
        super().__init__("gazette source reader schema", reason)


def columns(opts: ReadOptions) -> dict[str, str]:
    """The columns the framing produces and their types (Spark's simple strings), but
    ``data``."""
    out = {"journal": "string", "offset": "bigint",
           "value": "binary" if opts.framing == "fixed" else "string"}
    if opts.has_uuids:
        out.update(_UUID_COLUMNS)
    return out


def schema_ddl(opts: ReadOptions) -> str:
    """The rows' schema: where each message is, its value, its UUID's parts (framings
    that carry them) and, for json with a schema, its parsed ``data``."""
    ddl = ", ".join(f"{name} {kind}" for name, kind in columns(opts).items())
    if opts.json_schema:
        ddl += f", data struct<{opts.json_schema}>"
    return ddl


def check_schema(schema: StructType, opts: ReadOptions) -> None:
    """A reader schema is honoured when it is some of the columns the framing produces,
    in any order, with their types (``data``: any struct, for framing=json, which the
    documents are parsed into); else refused naming what is expected."""
    produced = columns(opts)
    expected = schema_ddl(opts)
    if opts.framing == "json" and not opts.json_schema:
        expected += ", data struct<...>"
    expected = f"framing={opts.framing} produces {expected} (any of them, in any order)"
    if not schema.fields:
        raise SchemaError(f"has no columns; {expected}")
    seen: set[str] = set()
    for f in schema.fields:
        if f.name in seen:
            raise SchemaError(f"column {f.name!r} is given twice; {expected}")
        seen.add(f.name)
        if f.name == "data" and opts.framing != "json":
            raise SchemaError(f"column 'data' (parsed documents) needs framing=json; "
                              f"{expected}")
        if f.name == "data":
            if not isinstance(f.dataType, StructType):
                raise SchemaError(f"column 'data' is {f.dataType.simpleString()}, not a "
                                  f"struct of the documents' fields; {expected}")
            continue
        want = produced.get(f.name)
        if want is None:
            raise SchemaError(f"column {f.name!r} is not one the source produces; "
                              f"{expected}")
        if f.dataType.simpleString() != want:
            raise SchemaError(f"column {f.name!r} is {f.dataType.simpleString()}, not "
                              f"{want}; {expected}")


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

    def schema(self) -> str:  # (asked of batch reads and streams alike)
        return schema_ddl(ReadOptions.parse(self._options, streaming=None))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = ReadOptions.parse(self._options)
        check_schema(schema, opts)
        return GazetteReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = ReadOptions.parse(self._options, streaming=True)
        check_schema(schema, opts)
        return GazetteStreamReader(opts, schema)


class GazetteReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts, self.schema = opts, schema

    def partitions(self) -> list[InputPartition]:
        _, slices = _plan(self.opts)
        return [SlicePartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.opts, self.schema)


class GazetteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{journal: offset}``: a micro-batch reads each journal from the last
    batch's offset to the end of its persisted fragments now, or, with
    ``maxBytesPerTrigger`` (``maxOffsetsPerTrigger``: the same, offsets are bytes), about
    that many bytes in whole fragments. Journals that appear later are read from their
    earliest fragment. The query's progress reports each journal's head as listed
    (``latestOffset``: with ``broker=``, what is not persisted yet too) beside where the
    batch ended. Read committed, each offset keeps the Sequencer's state too
    (`stream_state`)."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts, self.schema = opts, schema
        #: The listing `latestOffset` made, for the `partitions` call that follows it
        #: (one listing per micro-batch, not two).
        self._found: planning.Found | None = None
        #: Each journal's head as last listed (`reportLatestOffset`).
        self._available: dict[str, Any] | None = None
        #: With Trigger.AvailableNow: the ends when the query began (read no further).
        self._target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, Any]:
        the_plan, _ = _plan(self.opts)
        return stream_state.encode(the_plan.starts, {}, self.opts.read_committed)

    def getDefaultReadLimit(self) -> ReadLimit:
        budget = self.opts.max_bytes_per_trigger
        return ReadMaxBytes(budget) if budget else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        found = asyncio.run(planning.discover(self.opts))
        self._target = dict(planning.plan(found, _unbounded(self.opts)).ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._available

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: Any = None) -> dict[str, Any]:
        start = start or {}
        begins = stream_state.ends_of(start)
        opts = _unbounded(self.opts)
        if self._target is not None:  # (journals found since are left for later runs)
            opts = _ending_at(opts, {j: self._target.get(j, begins.get(j, 0))
                                     for j in {*self._target, *begins}})
        found = self._found = asyncio.run(planning.discover(self.opts))
        the_plan = planning.plan(found, opts, begins)
        if self._target is not None:
            the_plan.pieces = {j: ps for j, ps in the_plan.pieces.items()
                               if j in self._target}
            the_plan.ends = {j: e for j, e in the_plan.ends.items() if j in self._target}
        # (The heads as listed: with broker=, its fragments not persisted yet count.)
        self._available = {**begins, **the_plan.ends, **{
            j: max(f.end for f, _ in frags) for j, frags in found.items()
            if frags and (self._target is None or j in self._target)}}
        latest = dict(begins)
        if isinstance(limit, ReadMaxBytes):
            latest.update(planning.admitted(the_plan, begins, limit.max_bytes))
        else:
            latest.update(the_plan.ends)
        states = stream_state.states_of(start)
        if self.opts.read_committed:
            states.update(stream_state.sequence(stream_state.committed_slices(
                found, _ending_at(_unbounded(self.opts), latest), start, latest),
                self.opts))
        return stream_state.encode(latest, states, self.opts.read_committed)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[InputPartition]:
        ends = stream_state.ends_of(end)
        opts = _ending_at(_unbounded(self.opts), ends)
        found, self._found = self._found, None
        if self.opts.read_committed:
            if found is None:
                found = asyncio.run(planning.discover(opts))
            slices = stream_state.committed_slices(found, opts, start, ends)
        else:
            _, slices = _plan(opts, stream_state.ends_of(start), found)
        # (Journals listed since the batch's end was chosen are left for the next.)
        return [SlicePartition(s) for s in slices if s.journal in ends]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.opts, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        pass


def _unbounded(opts: ReadOptions) -> ReadOptions:
    """Journals a stream did not know yet are read from their earliest fragment."""
    return replace(opts, starting=Offsets(EARLIEST, opts.starting.by_journal))


def _ending_at(opts: ReadOptions, end: dict[str, Any]) -> ReadOptions:
    return replace(opts, ending=Offsets(LATEST, {j: int(o) for j, o in end.items()}))
