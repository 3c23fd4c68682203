"""What a journal's messages become as an Iceberg table's rows: the columns (declared as
``"word string, n long"`` or taken from an events topic's model), the metadata columns
every row has, the time partitioning, and the conversion of a transaction's messages into
one Arrow table.

Every row says where its message is and when it was published: ``_journal``, ``_offset``,
``_uuid`` (the message's Gazette UUID) and ``_published`` (the UUID's time, which the
table is partitioned by: a message's day or hour never changes when it is read again).
A declared column takes the message's field of its name; a topic's model fields come
from the event's ``data`` (and ``event_id``, ``event_key``, ``event_time`` from the
event). A value that does not fit its column fails the transaction naming the journal,
the offset and the column, unless ``bad_values="null"`` (then it is stored as null and
counted).
"""

from __future__ import annotations

import datetime as dt
import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from gazette.errors import GazetteError, ValidationError
from gazette.message.uuid import to_str, unix_time_of

_PRIMITIVES: dict[str, type[IcebergType]] = {
    "string": StringType, "long": LongType, "bigint": LongType, "int": IntegerType,
    "integer": IntegerType, "double": DoubleType, "float": FloatType,
    "boolean": BooleanType, "bool": BooleanType, "timestamp": TimestamptzType,
    "timestamptz": TimestamptzType, "date": DateType, "binary": BinaryType,
}
_PYTHON: dict[Any, str] = {str: "string", int: "long", float: "double", bool: "boolean",
                           bytes: "binary", dt.datetime: "timestamptz", dt.date: "date"}
#: Partitionings of ``_published``.
PARTITIONS = {"hour": HourTransform, "day": DayTransform, "month": MonthTransform,
              "none": None}
METADATA = (("_journal", "string"), ("_offset", "long"), ("_uuid", "string"),
            ("_published", "timestamptz"))
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
_EPOCH_DAY = dt.date(1970, 1, 1)


class BadValue(GazetteError):
    """A message's field does not fit its column."""


@dataclass(frozen=True)
class Column:
    """A column named `name` of `kind` (a type of the DDL), filled from the message's
    field at `path`."""

    name: str
    kind: str
    path: tuple[str, ...]

    @property
    def element(self) -> str:
        """A list's element type (``list<long>``: ``long``); "" for other kinds."""
        return self.kind[5:-1] if self.kind.startswith("list<") else ""


@dataclass(frozen=True)
class TableSchema:
    """The columns of a table fed from messages, and its partitioning."""

    columns: tuple[Column, ...]
    partition: str = "day"
    bad_values: str = "fail"
    _ids: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.partition not in PARTITIONS:
            raise ValidationError("partition", f"{self.partition!r} is not one of "
                                  + ", ".join(PARTITIONS))
        if self.bad_values not in ("fail", "null"):
            raise ValidationError("bad_values", f"{self.bad_values!r} is not fail or null")
        names = [c.name for c in self.columns]
        for name in names:
            if names.count(name) > 1:
                raise ValidationError("columns", f"column {name!r} is given twice")

    @classmethod
    def parse(cls, ddl: str, partition: str = "day", bad_values: str = "fail"
              ) -> TableSchema:
        """``"word string, n long, tags list<string>"``: each column from the message's
        field of its name (types: string, long, int, double, float, boolean, timestamp
        (Unix seconds or ISO 8601), date, binary, and list<type>)."""
        columns = []
        for i, part in enumerate(p.strip() for p in ddl.split(",") if p.strip()):
            words = part.split()
            if len(words) != 2:
                raise ValidationError(f"columns[{i}]", f"{part!r} is not 'name type'")
            name, kind = words[0], words[1].lower()
            _check_name(name, f"columns[{i}]")
            _check_kind(kind, f"columns[{i}]")
            columns.append(Column(name, kind, (name,)))
        if not columns:
            raise ValidationError("columns", "no column is declared")
        return cls(tuple(columns), partition, bad_values)

    @classmethod
    def of_model(cls, model: type, partition: str = "day", bad_values: str = "fail"
                 ) -> TableSchema:
        """The columns of an events topic's `model` (a dataclass, pydantic model or
        msgspec Struct): the event's id, key and time, then the model's fields (str,
        int, float, bool, bytes, datetime, date, and lists of them; an optional field's
        type is its value's)."""
        columns = [Column("event_id", "string", ("id",)),
                   Column("event_key", "string", ("key",)),
                   Column("event_time", "timestamptz", ("time",))]
        for name, hint in typing.get_type_hints(model).items():
            if name.startswith("_") or name == "uuid":
                continue
            _check_name(name, f"{model.__name__}.{name}")
            columns.append(Column(name, _kind_of(hint, f"{model.__name__}.{name}"),
                                  ("data", name)))
        return cls(tuple(columns), partition, bad_values)

    def iceberg(self) -> Schema:
        """The table's Iceberg schema: metadata columns first, every column optional."""
        next_id = iter(range(1, 10_000))
        fields = []
        for name, kind in [*METADATA, *((c.name, c.kind) for c in self.columns)]:
            fields.append(NestedField(next(next_id), name, _iceberg_type(kind, next_id),
                                      required=False))
        return Schema(*fields)

    def partition_spec(self, schema: Schema) -> PartitionSpec:
        transform = PARTITIONS[self.partition]
        if transform is None:
            return UNPARTITIONED_PARTITION_SPEC
        source = schema.find_field("_published").field_id
        return PartitionSpec(PartitionField(source_id=source, field_id=1000,
                                            transform=transform(),
                                            name=f"_published_{self.partition}"))


@dataclass
class Rows:
    """The rows of one transaction, column by column."""

    schema: TableSchema
    values: dict[str, list[Any]] = field(default_factory=dict)
    bad: int = 0

    def __post_init__(self) -> None:
        self.values = {name: [] for name, _ in METADATA}
        self.values.update({c.name: [] for c in self.schema.columns})

    def __len__(self) -> int:
        return len(self.values["_offset"])

    def add(self, journal: str, offset: int, uuid: int, message: Any) -> None:
        """The row of `message` (a dict, as JSON messages decode; or an object with the
        fields as attributes) read at `journal`:`offset`."""
        v = self.values
        v["_journal"].append(journal)
        v["_offset"].append(offset)
        v["_uuid"].append(to_str(uuid) if uuid else None)
        v["_published"].append(int(unix_time_of(uuid) * 1e6) if uuid else None)
        for col in self.schema.columns:
            value = _field(message, col.path)
            if value is not None and col.kind in ("timestamp", "timestamptz", "date"):
                try:
                    value = _temporal(value, col.kind)
                except (TypeError, ValueError, OverflowError) as err:
                    self._bad(journal, offset, col, value, str(err))
                    value = None
            v[col.name].append(value)

    def _bad(self, journal: str, offset: int, col: Column, value: Any, reason: str) -> None:
        """Count a value stored as null, or fail naming where it is."""
        if self.schema.bad_values == "null":
            self.bad += 1
            return
        raise BadValue(f"{journal}:{offset}: column {col.name} ({col.kind}): "
                       f"{value!r:.80} does not fit: {reason} (bad_values='null' stores "
                       "such values as null)")

    def table(self, arrow_schema: pa.Schema) -> pa.Table:
        """The rows as Arrow, in `arrow_schema` (the table's)."""
        arrays = []
        for f in arrow_schema:
            values = self.values[f.name]
            try:
                arrays.append(pa.array(values, f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
                arrays.append(self._fix(f, values, str(err)))
        return pa.Table.from_arrays(arrays, schema=arrow_schema)

    def _fix(self, f: pa.Field, values: list[Any], reason: str) -> pa.Array:
        """A column Arrow refused: find the values that do not fit (one at a time)."""
        col = next(c for c in self.schema.columns if c.name == f.name)
        out = []
        for i, value in enumerate(values):
            try:
                pa.array([value], f.type)
                out.append(value)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
                self._bad(self.values["_journal"][i], self.values["_offset"][i], col,
                          value, str(err) or reason)
                out.append(None)
        return pa.array(out, f.type)


def _check_name(name: str, where: str) -> None:
    if not _NAME.fullmatch(name) or name.lower() in {n for n, _ in METADATA}:
        raise ValidationError(where, f"{name!r} is not a column name (a letter, then "
                              "letters, digits, '_'; not one of the metadata columns "
                              + ", ".join(n for n, _ in METADATA) + ")")


def _check_kind(kind: str, where: str) -> None:
    element = kind[5:-1] if kind.startswith("list<") and kind.endswith(">") else kind
    if element not in _PRIMITIVES:
        raise ValidationError(where, f"type {kind!r} is not one of "
                              + ", ".join(sorted(_PRIMITIVES)) + " or list<type>")


def _kind_of(hint: Any, where: str) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (list, tuple, Sequence, Iterable) and args:
        return f"list<{_kind_of(args[0], where)}>"
    if origin is not None and len(args) == 1:  # Optional[X], X | None
        return _kind_of(args[0], where)
    if hint in _PYTHON:
        return _PYTHON[hint]
    raise ValidationError(where, f"{hint!r} has no column type: declare the table's "
                          "columns instead")


def _iceberg_type(kind: str, ids: Iterable[int]) -> IcebergType:
    if kind.startswith("list<"):
        element = _PRIMITIVES[kind[5:-1]]()
        return ListType(next(iter(ids)), element, element_required=False)
    return _PRIMITIVES[kind]()


def _field(message: Any, path: tuple[str, ...]) -> Any:
    value = message
    for name in path:
        if value is None:
            return None
        value = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
    return value


def _temporal(value: Any, kind: str) -> Any:
    """Unix seconds or ISO 8601 as Arrow takes them (microseconds; a date's days)."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a time")
    if kind == "date":
        if isinstance(value, str):
            return (dt.date.fromisoformat(value) - _EPOCH_DAY).days
        if isinstance(value, (int, float)):
            return int(value // 86400)
        raise TypeError(f"{type(value).__name__} is not a date")
    if isinstance(value, (int, float)):
        return int(value * 1_000_000)
    if isinstance(value, str):
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return int(when.timestamp() * 1_000_000)
    raise TypeError(f"{type(value).__name__} is not a time")
