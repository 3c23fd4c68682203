"""JournalSpec: the declared existence and behaviour of a journal.

A spec is validated when it is built, so an invalid spec never exists: `from_dict` turns
the YAML form (as in ``gazctl journals apply``) into one, naming the field of any error,
and `to_dict` gives the canonical YAML form back.
"""

from __future__ import annotations

import enum
import urllib.parse
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gazette import names
from gazette.errors import ValidationError, short_repr
from gazette.labels import RESERVED_JOURNAL_LABELS, LabelSet
from gazette.protocol.durations import format_duration
from gazette.protocol.fields import (
    INT64_MAX,
    FieldReader,
    build,
    check_duration,
    check_range,
    join_field,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

DEFAULT_REPLICATION = 3
MAX_REPLICATION = 1024
DEFAULT_FRAGMENT_LENGTH = 512 * MiB
MIN_FRAGMENT_LENGTH, MAX_FRAGMENT_LENGTH = 1 * KiB, 16 * GiB
DEFAULT_REFRESH_INTERVAL = timedelta(minutes=5)
MIN_REFRESH_INTERVAL, MAX_REFRESH_INTERVAL = timedelta(seconds=1), timedelta(days=1)
DEFAULT_FLUSH_INTERVAL = timedelta(minutes=10)
MIN_FLUSH_INTERVAL = timedelta(seconds=1)
MAX_STORES = 8
#: Labels that describe the content of the whole journal, so one value only.
SINGLE_VALUE_LABELS = frozenset({"content-type", "app.gazette.dev/message-type"})

STORE_SCHEMES = ("file", "s3")
#: Characters of an S3 bucket name (ASCII only: ``str.islower`` would take ``ü``).
_BUCKET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
#: Query parameters an ``s3://`` store URL may carry.
S3_STORE_PARAMS = frozenset({"endpoint", "region", "profile", "storage_class", "sse", "acl"})


class CompressionCodec(enum.StrEnum):
    """How fragments are compressed in stores."""

    NONE = "NONE"
    GZIP = "GZIP"
    ZSTANDARD = "ZSTANDARD"
    SNAPPY = "SNAPPY"
    #: Stored gzip, but served to readers compressed so clients decompress.
    GZIP_OFFLOAD_DECOMPRESSION = "GZIP_OFFLOAD_DECOMPRESSION"

    @classmethod
    def parse(cls, value: object, field: str) -> CompressionCodec:
        if isinstance(value, CompressionCodec):
            return value
        if isinstance(value, str):
            try:
                return cls(value.upper())
            except ValueError:
                pass
        raise ValidationError(
            field, f"unknown codec {short_repr(value)} (one of: {', '.join(c.value for c in cls)})"
        )


class JournalFlags(enum.IntFlag):
    """Which operations a journal allows. No flag set means read and write."""

    NOT_SPECIFIED = 0
    O_RDONLY = 1
    O_WRONLY = 2
    O_RDWR = 4

    @classmethod
    def parse(cls, value: object, field: str) -> JournalFlags:
        """From a bitmask, a flag name (``O_RDONLY``) or a list of names."""
        if isinstance(value, bool):
            raise ValidationError(field, f"expected flag names, got {short_repr(value)}")
        if isinstance(value, int):
            # A plain int mask: ``~`` of an IntFlag keeps only known bits (it is 0 here).
            if value < 0 or value & ~int(cls.O_RDONLY | cls.O_WRONLY | cls.O_RDWR):
                raise ValidationError(
                    field, f"{short_repr(value)} is not a combination of known flags")
            flags = cls(value)
        else:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list):
                raise ValidationError(field, f"expected flag names, got {type(value).__name__}")
            flags = cls.NOT_SPECIFIED
            for i, item in enumerate(items):
                name = item.strip().upper() if isinstance(item, str) else item
                if not isinstance(name, str) or name not in cls.__members__:
                    where = field if isinstance(value, str) else f"{field}[{i}]"
                    raise ValidationError(
                        where,
                        f"unknown flag {short_repr(item)} (one of: O_RDONLY, O_WRONLY, O_RDWR)",
                    )
                flags |= cls[name]
        if flags & cls.O_RDWR and flags & (cls.O_RDONLY | cls.O_WRONLY):
            raise ValidationError(field, "O_RDWR cannot be combined with O_RDONLY or O_WRONLY")
        if flags & cls.O_RDONLY and flags & cls.O_WRONLY:
            raise ValidationError(field, "O_RDONLY and O_WRONLY together: use O_RDWR")
        return flags

    @property
    def may_read(self) -> bool:
        return not self & JournalFlags.O_WRONLY

    @property
    def may_write(self) -> bool:
        return not self & JournalFlags.O_RDONLY

    def format(self) -> str:
        return self.name or "NOT_SPECIFIED"


class SuspendLevel(enum.StrEnum):
    """A journal with no recent appends may be suspended to save broker resources."""

    NONE = "NONE"
    PARTIAL = "PARTIAL"
    FULL = "FULL"


@dataclass(frozen=True, slots=True)
class Suspend:
    level: SuspendLevel = SuspendLevel.NONE
    offset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.level, SuspendLevel):
            raise ValidationError("level", f"expected a SuspendLevel, got {short_repr(self.level)}")
        check_range(self.offset, "offset", 0, INT64_MAX)

    @classmethod
    def from_dict(cls, data: object, field: str = "suspend") -> Suspend:
        r = FieldReader(data, field)
        level_raw = r.raw("level", "NONE")
        if not isinstance(level_raw, str) or level_raw.upper() not in SuspendLevel.__members__:
            raise ValidationError(
                r.field("level"),
                f"unknown level {short_repr(level_raw)} (one of: NONE, PARTIAL, FULL)",
            )
        offset = r.integer("offset", 0, lo=0, hi=INT64_MAX)
        r.done()
        return cls(SuspendLevel(level_raw.upper()), offset)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level.value, "offset": self.offset}


def validate_store_url(url: object, field: str) -> str:
    """A fragment store: ``file:///sub/dir/`` (under the broker's file root) or
    ``s3://bucket/prefix/?endpoint=...``; the path must end with ``/``."""
    if not isinstance(url, str):
        raise ValidationError(field, f"expected a URL string, got {type(url).__name__}")
    bad = next((ch for ch in url if ch.isspace() or not ch.isprintable()), None)
    if bad is not None:
        # urlsplit silently drops tabs and newlines: what we checked would not be what
        # we store.
        raise ValidationError(field, f"{short_repr(url)}: must not contain whitespace or control "
                              f"characters (U+{ord(bad):04X})")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise ValidationError(field, f"{short_repr(url)} is not a URL: {exc}") from None
    if parts.scheme not in STORE_SCHEMES or not url.startswith(parts.scheme + ":"):
        raise ValidationError(
            field, f"{short_repr(url)}: scheme must be one of "
            f"{', '.join(s + '://' for s in STORE_SCHEMES)}"
        )
    if parts.fragment or "#" in url:
        raise ValidationError(field, f"{short_repr(url)}: must not have a #fragment")
    if not parts.path.endswith("/"):
        raise ValidationError(field, f"{short_repr(url)}: path must end with '/'")
    if not parts.path.startswith("/"):
        raise ValidationError(field, f"{short_repr(url)}: path must be absolute, as in file:///path/")
    # Also percent-decoded: a store that unquotes its path must not climb out of its root.
    segments = parts.path.split("/") + urllib.parse.unquote(parts.path).split("/")
    if any(seg in (".", "..") for seg in segments):
        raise ValidationError(field, f"{short_repr(url)}: path must not contain '.' or '..'")
    if "//" in parts.path:
        raise ValidationError(field, f"{short_repr(url)}: path must not contain '//'")
    if parts.scheme == "file":
        if parts.netloc:
            raise ValidationError(
                field, f"{short_repr(url)}: file stores have no host; "
                "write file:///path/ (three slashes)"
            )
        if parts.query:
            raise ValidationError(field, f"{short_repr(url)}: file stores take no query parameters")
    else:
        bucket = parts.netloc
        if not (3 <= len(bucket) <= 63) or not all(
            c in _BUCKET_CHARS for c in bucket
        ) or not (bucket[0].isalnum() and bucket[-1].isalnum()):
            raise ValidationError(
                field, f"{short_repr(url)}: {bucket!r} is not a valid S3 bucket name "
                "(3-63 lowercase letters, digits, '-' and '.')"
            )
        try:
            query = urllib.parse.parse_qs(parts.query, keep_blank_values=True,
                                          strict_parsing=bool(parts.query))
        except ValueError:
            raise ValidationError(field, f"{short_repr(url)}: malformed query string") from None
        for key, values in query.items():
            if key not in S3_STORE_PARAMS:
                raise ValidationError(
                    field, f"{short_repr(url)}: unknown parameter {key!r} "
                    f"(known: {', '.join(sorted(S3_STORE_PARAMS))})"
                )
            if len(values) != 1:
                raise ValidationError(field, f"{short_repr(url)}: parameter {key!r} is repeated")
    return url


@dataclass(frozen=True, slots=True)
class FragmentSpec:
    """How a journal is cut into fragments and where fragments are persisted."""

    length: int = DEFAULT_FRAGMENT_LENGTH
    compression_codec: CompressionCodec = CompressionCodec.SNAPPY
    stores: tuple[str, ...] = ()
    refresh_interval: timedelta = DEFAULT_REFRESH_INTERVAL
    retention: timedelta = timedelta(0)
    flush_interval: timedelta = DEFAULT_FLUSH_INTERVAL
    path_postfix_template: str = ""

    def __post_init__(self) -> None:
        check_range(self.length, "length", MIN_FRAGMENT_LENGTH, MAX_FRAGMENT_LENGTH, "bytes")
        if not isinstance(self.compression_codec, CompressionCodec):
            raise ValidationError(
                "compression_codec", f"{short_repr(self.compression_codec)} is no codec")
        if len(self.stores) > MAX_STORES:
            raise ValidationError("stores", f"at most {MAX_STORES} stores, got {len(self.stores)}")
        seen: set[str] = set()
        for i, url in enumerate(self.stores):
            validate_store_url(url, f"stores[{i}]")
            if url in seen:
                raise ValidationError(f"stores[{i}]", f"{short_repr(url)} is listed twice")
            seen.add(url)
        check_duration(self.refresh_interval, "refresh_interval",
                       MIN_REFRESH_INTERVAL, MAX_REFRESH_INTERVAL)
        check_duration(self.retention, "retention", timedelta(0))
        check_duration(self.flush_interval, "flush_interval", MIN_FLUSH_INTERVAL, zero_ok=True)
        _validate_postfix_template(self.path_postfix_template)

    @classmethod
    def from_dict(cls, data: object, field: str = "fragment") -> FragmentSpec:
        r = FieldReader(data, field)
        d = cls()
        stores_raw = r.raw("stores", [])
        if not isinstance(stores_raw, list):
            raise ValidationError(r.field("stores"), "expected a list of store URLs")
        values = dict(
            length=r.integer("length", d.length),
            compression_codec=CompressionCodec.parse(
                r.raw("compression_codec", d.compression_codec), r.field("compression_codec")
            ),
            stores=tuple(stores_raw),
            refresh_interval=r.duration("refresh_interval", d.refresh_interval),
            retention=r.duration("retention", d.retention),
            flush_interval=r.duration("flush_interval", d.flush_interval),
            path_postfix_template=r.string("path_postfix_template", ""),
        )
        r.done()
        return build(cls, field, **values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "length": self.length,
            "compression_codec": self.compression_codec.value,
            "stores": list(self.stores),
            "refresh_interval": format_duration(self.refresh_interval),
            "retention": format_duration(self.retention),
            "flush_interval": format_duration(self.flush_interval),
        }
        if self.path_postfix_template:
            out["path_postfix_template"] = self.path_postfix_template
        return out


#: Placeholders a fragment path postfix template may use (Hive-style partitioning).
POSTFIX_PLACEHOLDERS = frozenset({"date", "year", "month", "day", "hour"})


def _validate_postfix_template(template: str) -> None:
    """A path postfix like ``date={date}/hour={hour}`` inserted before fragment names:
    Hive-style ``key=value`` folders, so query engines can prune by them."""
    field = "path_postfix_template"
    if not template:
        return
    if len(template) > 256:
        raise ValidationError(field, "is longer than 256 characters")
    import string

    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValidationError(field, f"{template!r}: {exc}") from None
    literal = ""
    for text, name, spec, conv in parsed:
        literal += text
        if name is None:
            continue
        literal += "x"  # what the placeholder expands to, for the path checks below
        if name not in POSTFIX_PLACEHOLDERS or spec or conv:
            raise ValidationError(
                field, f"{template!r}: unknown placeholder {{{name}}} "
                f"(known: {', '.join('{' + p + '}' for p in sorted(POSTFIX_PLACEHOLDERS))})"
            )
    try:
        names.validate_path(literal, field, 1, 512, names.PATH_SYMBOLS + "=")
    except ValidationError as err:
        raise ValidationError(
            field, f"{template!r}, with placeholders read as 'x': {err.reason}") from None
    # Hive-style folders (key=value): a '=' is what tells a postfix folder from the
    # journal's own name in a store listing (journal names never contain '=').
    for folder in literal.split("/"):
        if "=" not in folder.strip("="):
            raise ValidationError(
                field, f"{template!r}: each folder must be key=value, as 'date={{date}}'")


@dataclass(frozen=True, slots=True)
class JournalSpec:
    """The declared existence and behaviour of one journal."""

    name: str
    replication: int = DEFAULT_REPLICATION
    labels: LabelSet = field(default_factory=LabelSet)
    fragment: FragmentSpec = field(default_factory=FragmentSpec)
    flags: JournalFlags = JournalFlags.NOT_SPECIFIED
    max_append_rate: int = 0
    suspend: Suspend | None = None

    def __post_init__(self) -> None:
        names.validate_journal_name(self.name, "name")
        check_range(self.replication, "replication", 1, MAX_REPLICATION)
        validate_spec_labels(self.labels, RESERVED_JOURNAL_LABELS)
        if not isinstance(self.fragment, FragmentSpec):
            raise ValidationError(
                "fragment", f"expected a FragmentSpec, got {short_repr(self.fragment)}")
        if not isinstance(self.flags, JournalFlags):
            raise ValidationError("flags", f"expected JournalFlags, got {short_repr(self.flags)}")
        JournalFlags.parse(int(self.flags), "flags")  # rejects invalid combinations
        check_range(self.max_append_rate, "max_append_rate", 0, INT64_MAX, "bytes per second")
        if self.suspend is not None and not isinstance(self.suspend, Suspend):
            raise ValidationError("suspend", f"expected a Suspend, got {short_repr(self.suspend)}")

    @classmethod
    def from_dict(cls, data: object, field: str = "") -> JournalSpec:
        """The YAML form; missing fields take their defaults, unknown ones are errors."""
        r = FieldReader(data, field)
        name = r.raw("name")
        names.validate_journal_name(name, r.field("name"))
        values = dict(
            name=name,
            replication=r.integer("replication", DEFAULT_REPLICATION, 1, MAX_REPLICATION),
            labels=LabelSet.from_list(r.raw("labels", []), r.field("labels")),
            fragment=FragmentSpec.from_dict(r.raw("fragment", {}), r.field("fragment")),
            flags=JournalFlags.parse(r.raw("flags", 0), r.field("flags")),
            max_append_rate=r.integer("max_append_rate", 0, lo=0, hi=INT64_MAX),
            suspend=Suspend.from_dict(suspend_raw, r.field("suspend"))
            if (suspend_raw := r.raw("suspend", None)) is not None else None,
        )
        r.integer("revision", 0, lo=0)  # carried by YAML listings; the caller reads it
        r.done()
        return build(cls, field, **values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "replication": self.replication}
        if self.labels:
            out["labels"] = self.labels.to_list()
        out["fragment"] = self.fragment.to_dict()
        if self.flags:
            out["flags"] = self.flags.format()
        if self.max_append_rate:
            out["max_append_rate"] = self.max_append_rate
        if self.suspend is not None:
            out["suspend"] = self.suspend.to_dict()
        return out


def validate_spec_labels(labels: LabelSet, reserved: frozenset[str]) -> None:
    """User labels must not redefine implicit ones, and some must be single-valued."""
    if not isinstance(labels, LabelSet):
        raise ValidationError("labels", f"expected a LabelSet, got {type(labels).__name__}")
    for name in labels.names():
        if name in reserved:
            raise ValidationError(
                join_field("labels", name), "is implicit and cannot be set on a spec"
            )
        if name in SINGLE_VALUE_LABELS and len(labels.values(name)) > 1:
            raise ValidationError(join_field("labels", name), "may have only one value")
