"""ShardSpec: the declared existence and configuration of a consumer shard."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gazette import names
from gazette.errors import ValidationError, short_repr
from gazette.labels import RESERVED_SHARD_LABELS, LabelSet
from gazette.protocol.durations import format_duration
from gazette.protocol.fields import (
    INT64_MAX,
    FieldReader,
    build,
    check_duration,
    check_range,
    type_name,
)
from gazette.protocol.journal_spec import validate_spec_labels

DEFAULT_MAX_TXN_DURATION = timedelta(seconds=1)
MAX_TXN_DURATION_LIMIT = timedelta(hours=1)
DEFAULT_RING_BUFFER_SIZE = 8192
DEFAULT_READ_CHANNEL_SIZE = 4096
MAX_HOT_STANDBYS = 32
MAX_HINT_BACKUPS = 16
MAX_SOURCES = 1024


@dataclass(frozen=True, slots=True)
class ShardSource:
    """A journal the shard reads, from `min_offset` on (earlier content is skipped)."""

    journal: str
    min_offset: int = 0

    def __post_init__(self) -> None:
        names.validate_journal_name(self.journal, "journal")
        check_range(self.min_offset, "min_offset", 0, INT64_MAX)

    @classmethod
    def from_dict(cls, data: object, field: str) -> ShardSource:
        r = FieldReader(data, field)
        values = {
            "journal": names.validate_journal_name(r.raw("journal"), r.field("journal")),
            "min_offset": r.integer("min_offset", 0, lo=0, hi=INT64_MAX),
        }
        r.done()
        return build(cls, field, **values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"journal": self.journal}
        if self.min_offset:
            out["min_offset"] = self.min_offset
        return out


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """A shard: its sources, its store's recovery log, and how it runs transactions."""

    id: str
    sources: tuple[ShardSource, ...]
    recovery_log_prefix: str = ""
    hint_prefix: str = ""
    hint_backups: int = 0
    max_txn_duration: timedelta = DEFAULT_MAX_TXN_DURATION
    min_txn_duration: timedelta = timedelta(0)
    disable: bool = False
    hot_standbys: int = 0
    labels: LabelSet = field(default_factory=LabelSet)
    disable_wait_for_ack: bool = False
    ring_buffer_size: int = DEFAULT_RING_BUFFER_SIZE
    read_channel_size: int = DEFAULT_READ_CHANNEL_SIZE

    def __post_init__(self) -> None:
        names.validate_shard_id(self.id, "id")
        if not self.sources:
            raise ValidationError("sources", "a shard needs at least one source journal")
        if len(self.sources) > MAX_SOURCES:
            raise ValidationError("sources", f"at most {MAX_SOURCES} sources")
        seen: dict[str, int] = {}
        for i, source in enumerate(self.sources):
            if not isinstance(source, ShardSource):
                raise ValidationError(f"sources[{i}]", f"expected a ShardSource, got "
                                      f"{type_name(source)}")
            if source.journal in seen:
                raise ValidationError(
                    f"sources[{i}].journal",
                    f"{source.journal!r} is already sources[{seen[source.journal]}]",
                )
            seen[source.journal] = i
        if self.recovery_log_prefix:
            names.validate_path(self.recovery_log_prefix, "recovery_log_prefix", 1,
                                names.MAX_JOURNAL_NAME_LEN)
            log_name_len = len(self.recovery_log_prefix) + 1 + len(self.id)
            if log_name_len > names.MAX_JOURNAL_NAME_LEN:
                raise ValidationError(
                    "recovery_log_prefix",
                    f"the recovery log '<prefix>/<id>' would be {log_name_len} characters, "
                    f"longer than a journal name may be ({names.MAX_JOURNAL_NAME_LEN})",
                )
            if not self.hint_prefix:
                raise ValidationError(
                    "hint_prefix", "is required with a recovery_log_prefix "
                    "(an etcd prefix such as '/gazette/hints')"
                )
        elif self.hint_prefix or self.hint_backups:
            raise ValidationError(
                "hint_prefix" if self.hint_prefix else "hint_backups",
                "only applies with a recovery_log_prefix",
            )
        if self.hint_prefix:
            names.validate_etcd_prefix(self.hint_prefix, "hint_prefix")
        check_range(self.hint_backups, "hint_backups", 0, MAX_HINT_BACKUPS)
        check_duration(self.max_txn_duration, "max_txn_duration",
                       timedelta(milliseconds=1), MAX_TXN_DURATION_LIMIT)
        check_duration(self.min_txn_duration, "min_txn_duration", timedelta(0))
        if self.min_txn_duration > self.max_txn_duration:
            raise ValidationError(
                "min_txn_duration",
                f"{format_duration(self.min_txn_duration)} exceeds max_txn_duration "
                f"{format_duration(self.max_txn_duration)}",
            )
        check_range(self.hot_standbys, "hot_standbys", 0, MAX_HOT_STANDBYS)
        validate_spec_labels(self.labels, RESERVED_SHARD_LABELS)
        check_range(self.ring_buffer_size, "ring_buffer_size", 1, 1 << 24)
        check_range(self.read_channel_size, "read_channel_size", 1, 1 << 24)
        for key in ("disable", "disable_wait_for_ack"):
            value = getattr(self, key)
            if not isinstance(value, bool):
                raise ValidationError(key, f"expected true or false, got {short_repr(value)}")

    @property
    def recovery_log(self) -> str | None:
        """The journal recording this shard's store, if it has one."""
        return f"{self.recovery_log_prefix}/{self.id}" if self.recovery_log_prefix else None

    @property
    def hint_keys(self) -> tuple[str, ...]:
        """etcd keys of the primary hints (``<hint_prefix>/<id>.primary``), then of each
        backup (``<id>.backup.<n>``), newest first."""
        if not self.hint_prefix:
            return ()
        base = f"{self.hint_prefix}/{self.id}"
        return (f"{base}.primary",
                *(f"{base}.backup.{i}" for i in range(1, self.hint_backups + 1)))

    @classmethod
    def from_dict(cls, data: object, field: str = "") -> ShardSpec:
        r = FieldReader(data, field)
        shard_id = names.validate_shard_id(r.raw("id"), r.field("id"))
        sources_raw = r.raw("sources", [])
        if not isinstance(sources_raw, list):
            raise ValidationError(r.field("sources"), "expected a list of sources")
        d = DEFAULT_MAX_TXN_DURATION
        values = {
            "id": shard_id,
            "sources": tuple(
                ShardSource.from_dict(s, f"{r.field('sources')}[{i}]")
                for i, s in enumerate(sources_raw)
            ),
            "recovery_log_prefix": r.string("recovery_log_prefix", ""),
            "hint_prefix": r.string("hint_prefix", ""),
            "hint_backups": r.integer("hint_backups", 0, 0, MAX_HINT_BACKUPS),
            "max_txn_duration": r.duration("max_txn_duration", d),
            "min_txn_duration": r.duration("min_txn_duration", timedelta(0)),
            "disable": r.boolean("disable"),
            "hot_standbys": r.integer("hot_standbys", 0, 0, MAX_HOT_STANDBYS),
            "labels": LabelSet.from_list(r.raw("labels", []), r.field("labels")),
            "disable_wait_for_ack": r.boolean("disable_wait_for_ack"),
            "ring_buffer_size": r.integer("ring_buffer_size", DEFAULT_RING_BUFFER_SIZE, 1),
            "read_channel_size": r.integer("read_channel_size", DEFAULT_READ_CHANNEL_SIZE, 1),
        }
        r.integer("revision", 0, lo=0)  # carried by YAML listings; the caller reads it
        r.done()
        return build(cls, field, **values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "sources": [s.to_dict() for s in self.sources]}
        if self.recovery_log_prefix:
            out["recovery_log_prefix"] = self.recovery_log_prefix
            out["hint_prefix"] = self.hint_prefix
            out["hint_backups"] = self.hint_backups
        out["max_txn_duration"] = format_duration(self.max_txn_duration)
        out["min_txn_duration"] = format_duration(self.min_txn_duration)
        if self.disable:
            out["disable"] = True
        out["hot_standbys"] = self.hot_standbys
        if self.labels:
            out["labels"] = self.labels.to_list()
        if self.disable_wait_for_ack:
            out["disable_wait_for_ack"] = True
        out["ring_buffer_size"] = self.ring_buffer_size
        out["read_channel_size"] = self.read_channel_size
        return out
