"""The options of the ``gazette`` source, parsed and checked once on the driver.

Spark hands a data source its options as strings; `ReadOptions.parse` turns them into
typed values and refuses what cannot work with an error naming the option and why, before
any job starts. Nothing here imports pyspark, so the parsing is tested without a JVM.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gazette.errors import ValidationError
from gazette.labels import Selector, parse_selector
from gazette.protocol import validate_store_url

#: Framings the source decodes, and whether each carries Gazette UUIDs.
FRAMINGS = {"lines": False, "json": True, "csv": True, "fixed": True}
EARLIEST, LATEST = "earliest", "latest"
#: Kafka's spellings of earliest and latest in a JSON offsets map.
_JSON_EARLIEST, _JSON_LATEST = -2, -1
DEFAULT_MAX_PARTITION_BYTES = 128 << 20
_MAX_OFFSET = (1 << 63) - 1


class OptionError(ValidationError):
    """An option of the ``gazette`` source that cannot be used; names the option."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"gazette source option {option!r}", reason)


@dataclass(frozen=True)
class Offsets:
    """Where reading starts or ends: ``earliest``, ``latest``, or a map of journal to
    offset (journals not in the map take `default`)."""

    default: str
    by_journal: Mapping[str, int] = field(default_factory=dict)

    def of(self, journal: str) -> str | int:
        """The offset of `journal`: an int, or `EARLIEST` / `LATEST`."""
        got = self.by_journal.get(journal)
        if got is None:
            return self.default
        return {_JSON_EARLIEST: EARLIEST, _JSON_LATEST: LATEST}.get(got, got)

    def to_json(self) -> str:
        return json.dumps(dict(self.by_journal)) if self.by_journal else self.default


@dataclass(frozen=True)
class ReadOptions:
    """What a read of the ``gazette`` source asks for (see docs/spark.md)."""

    selector: Selector
    broker: str = ""
    stores: tuple[str, ...] = ()
    starting: Offsets = Offsets(EARLIEST)
    ending: Offsets = Offsets(LATEST)
    #: Fragments modified in [start_time, end_time) (Unix seconds; 0: unbounded).
    start_time: int = 0
    end_time: int = 0
    framing: str = "lines"
    #: Spark DDL of the JSON documents, parsed into a ``data`` column (json only).
    json_schema: str = ""
    #: ``module:attr`` of the message class (csv, fixed).
    message_type: str = ""
    read_committed: bool = False
    fail_on_data_loss: bool = True
    min_partitions: int = 0
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    #: How long signed URLs from a broker stay valid (seconds).
    signature_ttl: int = 3600
    #: Listing stores directly, a hole before a fragment persisted less than this many
    #: seconds ago is taken for an upload still under way (brokers upload out of order):
    #: a read stops before it rather than calling it lost.
    hole_grace_seconds: int = 600
    #: A stream's micro-batch reads about this many bytes at most (0: all there is),
    #: rounded up to whole fragments (at least one per batch).
    max_bytes_per_trigger: int = 0
    #: Where reading starts: each journal's first fragment modified at or after this
    #: (Unix milliseconds; 0: ``startingOffsets`` says).
    starting_timestamp_ms: int = 0

    @property
    def has_uuids(self) -> bool:
        return FRAMINGS[self.framing]

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool | None = False
              ) -> ReadOptions:
        """`options` as Spark gives them (keys in any case), for a batch read, a stream
        (`streaming`), or either (None: what only one of them takes is not refused)."""
        opts = {k.lower(): v for k, v in options.items() if k.lower() != "path"}
        known = {"journals", "broker", "stores", "startingoffsets", "endingoffsets",
                 "starttime", "endtime", "framing", "schema", "messagetype",
                 "readcommitted", "failondataloss", "minpartitions",
                 "maxpartitionbytes", "signaturettl", "holegraceseconds",
                 "maxbytespertrigger", "maxoffsetspertrigger", "startingtimestamp"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise OptionError(unknown[0], "unknown option (known: " + ", ".join(sorted(
                ("journals", "broker", "stores", "startingOffsets", "endingOffsets",
                 "startTime", "endTime", "framing", "schema", "messageType",
                 "readCommitted", "failOnDataLoss", "minPartitions", "maxPartitionBytes",
                 "signatureTTL", "holeGraceSeconds", "maxBytesPerTrigger",
                 "maxOffsetsPerTrigger", "startingTimestamp"))) + ")")
        try:
            selector = parse_selector(opts.get("journals", ""), "journals")
        except ValidationError as err:
            raise OptionError("journals", str(err)) from None
        broker = opts.get("broker", "").strip()
        stores = tuple(s.strip() for s in opts.get("stores", "").split(",") if s.strip())
        if bool(broker) == bool(stores):
            raise OptionError("broker", "give exactly one of broker= (a broker address, "
                              "which lists fragments) or stores= (store URLs, listed "
                              "directly)")
        for url in stores:
            try:
                validate_store_url(url, "stores")
            except ValidationError as err:
                raise OptionError("stores", str(err)) from None
        if stores:
            _check_selector_by_name(selector)
        starting = _offsets(opts, "startingOffsets", EARLIEST)
        ending = _offsets(opts, "endingOffsets", LATEST)
        if streaming is False and starting.default == LATEST:
            raise OptionError("startingOffsets", "'latest' reads nothing in a batch query: "
                              "give 'earliest' or offsets per journal")
        if ending.default == EARLIEST or _JSON_EARLIEST in ending.by_journal.values():
            raise OptionError("endingOffsets", "cannot end at 'earliest'")
        if streaming and "endingoffsets" in opts:
            raise OptionError("endingOffsets", "a stream has no end: not for readStream")
        framing = opts.get("framing", "lines").strip().lower()
        if framing not in FRAMINGS:
            raise OptionError("framing", f"{framing!r} is not one of "
                              + ", ".join(FRAMINGS))
        json_schema = opts.get("schema", "").strip()
        if json_schema and framing != "json":
            raise OptionError("schema", "only framing=json parses documents into columns")
        message_type = opts.get("messagetype", "").strip()
        if message_type and framing not in ("csv", "fixed"):
            raise OptionError("messageType", "only csv and fixed framings take a "
                              "message class")
        if message_type and not re.fullmatch(r"[\w.]+:[\w.]+", message_type):
            raise OptionError("messageType", f"{message_type!r} is not module:attribute")
        read_committed = _bool(opts, "readCommitted", False)
        if read_committed and not FRAMINGS[framing]:
            raise OptionError("readCommitted", f"framing={framing} carries no message "
                              "UUIDs: use json, csv or fixed")
        limits = [_int(opts, name, 0, 1, _MAX_OFFSET)
                  for name in ("maxBytesPerTrigger", "maxOffsetsPerTrigger")
                  if name.lower() in opts]
        if limits and streaming is False:
            raise OptionError("maxBytesPerTrigger" if "maxbytespertrigger" in opts else
                              "maxOffsetsPerTrigger", "limits a stream's micro-batches: "
                              "for readStream only (a batch read takes endingOffsets)")
        starting_ms = _millis(opts, "startingTimestamp")
        if starting_ms and "startingoffsets" in opts:
            raise OptionError("startingTimestamp", "give startingOffsets or "
                              "startingTimestamp, not both")
        out = cls(
            selector=selector, broker=broker, stores=stores, starting=starting,
            ending=ending, start_time=_time(opts, "startTime"),
            end_time=_time(opts, "endTime"), framing=framing, json_schema=json_schema,
            message_type=message_type, read_committed=read_committed,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            min_partitions=_int(opts, "minPartitions", 0, 0, 1 << 20),
            max_partition_bytes=_int(opts, "maxPartitionBytes",
                                     DEFAULT_MAX_PARTITION_BYTES, 1 << 10, 1 << 40),
            signature_ttl=_int(opts, "signatureTTL", 3600, 60, 7 * 86400),
            hole_grace_seconds=_int(opts, "holeGraceSeconds", 600, 0, 7 * 86400),
            max_bytes_per_trigger=min(limits) if limits else 0,
            starting_timestamp_ms=starting_ms)
        if out.end_time and out.start_time >= out.end_time:
            raise OptionError("endTime", "must be after startTime")
        return out


def _check_selector_by_name(selector: Selector) -> None:
    names = {lb.name for lb in selector.include} | {lb.name for lb in selector.exclude}
    other = sorted(names - {"name", "prefix"})
    if other:
        raise OptionError("journals", f"with stores= journals are known only by name, so "
                          f"a selector can use name and prefix, not {other[0]!r}: pass "
                          "broker= to select by labels")


def _offsets(opts: Mapping[str, str], name: str, default: str) -> Offsets:
    text = opts.get(name.lower(), default).strip()
    if text.lower() in (EARLIEST, LATEST):
        return Offsets(text.lower())
    try:
        doc = json.loads(text)
    except ValueError:
        raise OptionError(name, f"{text[:80]!r} is not 'earliest', 'latest' or a JSON "
                          'object of journal to offset ({"a/b": 1024})') from None
    if not isinstance(doc, dict):
        raise OptionError(name, "JSON offsets must be an object of journal to offset")
    by_journal: dict[str, int] = {}
    for journal, offset in doc.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or not (
                -2 <= offset <= _MAX_OFFSET):
            raise OptionError(name, f"offset of {journal!r} must be an integer from 0 to "
                              f"2^63-1, or -2 (earliest) / -1 (latest), not {offset!r}")
        by_journal[journal] = offset
    return Offsets(default, by_journal)


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(name, f"{text!r} is not true or false")


def _int(opts: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = opts.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(name, f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise OptionError(name, f"{value} is outside [{low}, {high}]")
    return value


def _millis(opts: Mapping[str, str], name: str) -> int:
    """Unix milliseconds (as Kafka's source takes them), or an ISO 8601 time."""
    text = opts.get(name.lower(), "").strip()
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        return _time({name.lower(): text}, name) * 1000
    if not 0 < value <= _MAX_OFFSET:
        raise OptionError(name, f"{value} is not a positive number of milliseconds")
    return value


def _time(opts: Mapping[str, str], name: str) -> int:
    """Unix seconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    text = opts.get(name.lower(), "").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(name, f"{text!r} is neither Unix seconds nor an ISO 8601 "
                          "time (2026-11-24T10:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp())
