"""Ready-made message types, and the adapters framings use to build them.

Every message type here keeps its UUID in a field named ``uuid`` that holds the canonical
text form (``"1b4e28ba-2fa1-11d2-883f-0016d3cca427"``, see `gazette.message.uuid.to_str`).
A missing, null or empty ``uuid`` means the message has none: it is delivered
at-least-once (never de-duplicated, never part of a transaction). A ``uuid`` that is not
a version 1 UUID is an error: framings report such a message as an error frame.

Message types (all implement `gazette.message.base.Message`):

- `JsonMessage`: a ``dict`` (any JSON object); the default of the JSON framing.
- `DataclassMessage`: base of your dataclasses (``@dataclass class Click(DataclassMessage)``).
- `PydanticMessage`: base of your pydantic v2 models (imported on first use, as pydantic
  takes about 100 ms to import).
- `CsvRecord`: a ``list[str]`` whose column 0 is the UUID; the default of the CSV framing.
- `ProtoMessage`: wraps a generated protobuf message, which cannot be subclassed. Its UUID
  is its ``string uuid`` field (canonical text) or ``bytes uuid`` field (16 bytes, big
  endian); a class with neither is at-least-once.
- `AtLeastOnce`: wraps any value that cannot hold a UUID, such as a plain dataclass or a
  JSON array: published and read at-least-once.

Acknowledgements: a transactional Publisher asks a message for ``new_acknowledgement``
and writes it to each journal it published to, with an ACK UUID. That message goes through
the journal's framing and is read back like any other, so it must be a *valid* message of
the type. Classes with required fields therefore override the ``acknowledgement(journal)``
classmethod to return a valid placeholder (`DataclassMessage` raises a clear TypeError
when it cannot build one); `PydanticMessage` builds it with ``model_construct()`` and reads
back an ACK that does not validate with ``model_construct(uuid=...)``. Types without a UUID
acknowledge with `NO_ACKNOWLEDGEMENT`, which every framing encodes as zero bytes.

How framings make messages of these types (and of any class) from what they decode:
`gazette.message.adapters`.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import lshift, or_
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, final

from google.protobuf.message import Message as _ProtoBase

from gazette.errors import ValidationError, short_repr
from gazette.message.uuid import is_v1, parse, to_str

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "NO_ACKNOWLEDGEMENT",
    "UUID_FIELD",
    "AtLeastOnce",
    "CsvRecord",
    "DataclassMessage",
    "JsonMessage",
    "NoAcknowledgement",
    "ProtoMessage",
    "PydanticMessage",
    "UuidText",
    "canonical_uuid_ints",
    "check_uuid_texts",
    "proto_uuid_kind",
    "uuid_from_text",
]

#: The field (or key, or protobuf field) that holds a message's UUID.
UUID_FIELD = "uuid"

T = TypeVar("T")
M = TypeVar("M")
P = TypeVar("P", bound=_ProtoBase)


# -- UUID text -------------------------------------------------------------------------

_NOT_HEX_OR_DASH = str.maketrans("", "", "0123456789abcdef-")


def uuid_from_text(value: object, field: str = UUID_FIELD) -> int | None:
    """The UUID (an int) held by a ``uuid`` field: None when it is missing or empty;
    ValidationError when it is not text of a version 1 UUID."""
    if value is None or value == "":
        return None
    if type(value) is not str:
        raise ValidationError(
            field, f"expected a UUID string, got {type(value).__name__} {short_repr(value)}")
    # Fast path for the canonical form (what `to_str` writes); anything else is parse()'s.
    if (len(value) == 36 and value[14] == "1" and value[19] in "89abAB"
            and value[8] == value[13] == value[18] == value[23] == "-"):
        digits = value.replace("-", "")
        if len(digits) == 32 and digits.isascii() and digits.isalnum():
            try:
                return int(digits, 16)
            except ValueError:
                pass
    # Other forms parse() accepts ({...}, urn:uuid:..., no dashes), but not the signs,
    # underscores, spaces and non-ASCII digits that int() would let through.
    core = value.lower().replace("urn:", "", 1).replace("uuid:", "", 1).strip("{}")
    if not core.isascii() or core.translate(_NOT_HEX_OR_DASH):
        raise ValidationError(field, f"{short_repr(value[:60])} is not a UUID")
    return parse(value, field)


_HEX_AND_DASH = b"0123456789abcdefABCDEF-"


def canonical_uuid_ints(values: Sequence[object]) -> list[int] | None:
    """The UUIDs (ints) of many ``uuid`` field values when every one is canonical v1 text
    (what `to_str` writes), checked and converted in a few C-level passes; None when
    any is not (missing, another spelling, or not a UUID): ask `uuid_from_text`."""
    n = len(values)
    if not n:
        return []
    try:
        text = "".join(values).encode("ascii")  # type: ignore[arg-type]
    except (TypeError, UnicodeEncodeError):
        return None
    if not (len(text) == 36 * n and min(map(len, values)) == 36  # type: ignore[arg-type]
            and not text.translate(None, _HEX_AND_DASH)
            and text.count(b"-") == 4 * n
            and text[8::36].count(b"-") == n and text[13::36].count(b"-") == n
            and text[18::36].count(b"-") == n and text[23::36].count(b"-") == n
            and text[14::36].count(b"1") == n
            and not text[19::36].translate(None, b"89abAB")):
        return None
    halves = struct.unpack(f">{2 * n}Q", bytes.fromhex(text.replace(b"-", b"").decode()))
    return list(map(or_, map(lshift, halves[0::2], repeat(64)), halves[1::2]))


def check_uuid_texts(values: Sequence[object], field: str = UUID_FIELD) -> None:
    """Validate many ``uuid`` field values as `uuid_from_text` does, raising on the first
    bad one. All-canonical batches are checked at once (`canonical_uuid_ints`)."""
    if canonical_uuid_ints(values) is not None:
        return
    for value in values:
        uuid_from_text(value, field)


# -- Message types ---------------------------------------------------------------------

class JsonMessage(dict[str, Any]):
    """A JSON object as a message: a ``dict`` whose ``"uuid"`` key holds the UUID text.

    `new_acknowledgement` returns an empty message of the same class.
    """

    __slots__ = ()

    def get_uuid(self) -> int | None:
        return uuid_from_text(self.get(UUID_FIELD))

    def set_uuid(self, uuid: int) -> None:
        self[UUID_FIELD] = to_str(uuid)

    def new_acknowledgement(self, journal: str) -> Self:
        return type(self)()


class CsvRecord(list[str]):
    """A CSV record as a message: a ``list[str]`` whose column 0 is the UUID text (empty
    for none). `new_acknowledgement` returns a record of one (UUID) column."""

    __slots__ = ()

    def get_uuid(self) -> int | None:
        return uuid_from_text(self[0], "[0]") if self else None

    def set_uuid(self, uuid: int) -> None:
        if self:
            self[0] = to_str(uuid)
        else:
            self.append(to_str(uuid))

    def new_acknowledgement(self, journal: str) -> Self:
        return type(self)([""])


class UuidText:
    """The Message methods of classes that keep their UUID text in a ``uuid`` attribute."""

    __slots__ = ()
    uuid: str | None

    def get_uuid(self) -> int | None:
        return uuid_from_text(self.uuid)

    def set_uuid(self, uuid: int) -> None:
        setattr(self, UUID_FIELD, to_str(uuid))  # (mypy: not a slot of this mixin)

    def new_acknowledgement(self, journal: str) -> Self:
        return self.acknowledgement(journal)

    @classmethod
    def acknowledgement(cls, journal: str) -> Self:
        """A valid message of this class to carry an ACK UUID to `journal` (the
        Publisher sets the UUID). Override it when the default cannot build one."""
        raise NotImplementedError


@dataclass(slots=True)
class DataclassMessage(UuidText):
    """Base of dataclass messages: adds a keyword-only field ``uuid: str | None = None``
    (first in `dataclasses.fields` order, so it is column 0 in CSV) and the Message
    methods. Subclasses are ``@dataclass`` (slots welcome)::

        @dataclass(slots=True)
        class Click(DataclassMessage):
            user: str = ""
            count: int = 0

    Acknowledgements are built by ``cls.acknowledgement(journal)``, which calls ``cls()``:
    a class with required fields must override it to return a valid placeholder, else
    publishing it in a transaction raises TypeError.
    """

    uuid: str | None = field(default=None, kw_only=True)

    @classmethod
    def acknowledgement(cls, journal: str) -> Self:
        try:
            return cls()
        except TypeError as exc:
            raise TypeError(
                f"cannot build an acknowledgement of {cls.__qualname__} with {cls.__name__}()"
                f" ({exc}): give its fields defaults, or override the classmethod"
                f" {cls.__name__}.acknowledgement(journal) to return a valid placeholder"
            ) from exc


if TYPE_CHECKING:
    class PydanticMessage(UuidText, BaseModel):
        """Base of pydantic v2 messages (see `_define_pydantic_message`)."""

        uuid: str | None = None

        @classmethod
        def acknowledgement(cls, journal: str) -> Self:
            return cls.model_construct()


def _define_pydantic_message() -> type:
    from pydantic import BaseModel

    class PydanticMessage(UuidText, BaseModel):
        """Base of pydantic v2 messages: a field ``uuid: str | None = None`` (the first
        field) and the Message methods.

        Acknowledgements are built with ``model_construct()``, so required fields need not
        be given; such an ACK does not validate when read back, so a read ACK (a ``uuid``
        with the ACK_TXN flag) that fails validation becomes ``model_construct(uuid=...)``.
        Override ``acknowledgement(journal)`` to return a valid placeholder instead.
        `set_uuid` assigns the field: frozen models cannot be published.
        """

        uuid: str | None = None

        @classmethod
        def acknowledgement(cls, journal: str) -> Self:
            return cls.model_construct()

    PydanticMessage.__module__ = __name__
    return PydanticMessage


_DEFINE_LOCK = threading.Lock()


def __getattr__(name: str) -> Any:
    if name == "PydanticMessage":  # defined on first use: one class, even across threads
        with _DEFINE_LOCK:
            cls = globals().get(name)
            if cls is None:
                cls = globals()[name] = _define_pydantic_message()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@final
class NoAcknowledgement:
    """The acknowledgement of messages without a UUID: there is nothing to acknowledge,
    and every framing encodes it as zero bytes. Use the `NO_ACKNOWLEDGEMENT` instance."""

    __slots__ = ()

    def get_uuid(self) -> int | None:
        return None

    def set_uuid(self, uuid: int) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> NoAcknowledgement:
        return self

    def __repr__(self) -> str:
        return "NO_ACKNOWLEDGEMENT"


NO_ACKNOWLEDGEMENT = NoAcknowledgement()


class AtLeastOnce(Generic[T]):
    """A value that cannot hold a UUID, published and read *at-least-once*: it is never
    de-duplicated (a retried append may deliver it twice) and never waits for a
    transaction to commit. `get_uuid` is None, `set_uuid` does nothing, and its
    acknowledgement is `NO_ACKNOWLEDGEMENT` (zero bytes).

    As a framing's ``message_type``, ``AtLeastOnce[Point]`` reads values of ``Point``
    (any type `message_type` knows, or builtins such as ``list[int]``) wrapped in it.
    """

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def get_uuid(self) -> int | None:
        return None

    def set_uuid(self, uuid: int) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> NoAcknowledgement:
        return NO_ACKNOWLEDGEMENT

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtLeastOnce) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AtLeastOnce({self.value!r})"


_NO_UUID, _TEXT_UUID, _BYTES_UUID = 0, 1, 2


_PROTO_UUID_KINDS: dict[type[_ProtoBase], int] = {}


def proto_uuid_kind(cls: type[_ProtoBase]) -> int:
    """How protobuf class `cls` holds its UUID (text, bytes, or not at all), found once
    per class; a ``uuid`` field of another type raises `ValidationError`."""
    kind = _PROTO_UUID_KINDS.get(cls)
    if kind is None:
        kind = _PROTO_UUID_KINDS[cls] = _find_proto_uuid_kind(cls)
    return kind


def _find_proto_uuid_kind(cls: type[_ProtoBase]) -> int:
    from google.protobuf.descriptor import FieldDescriptor

    desc = cls.DESCRIPTOR.fields_by_name.get(UUID_FIELD)
    if desc is None:
        return _NO_UUID
    if not desc.is_repeated:
        if desc.type == FieldDescriptor.TYPE_STRING:
            return _TEXT_UUID
        if desc.type == FieldDescriptor.TYPE_BYTES:
            return _BYTES_UUID
    raise ValidationError(
        f"{cls.DESCRIPTOR.full_name}.{UUID_FIELD}",
        "must be a singular `string` (UUID text) or `bytes` (16 bytes) field to hold the"
        " message UUID; rename it, or use AtLeastOnce")


class ProtoMessage(Generic[P]):
    """A generated protobuf message as a Message (generated classes cannot be
    subclassed). Its UUID is its ``string uuid`` field (canonical text) or its
    ``bytes uuid`` field (16 bytes, big endian), empty for none; a message class
    without a ``uuid`` field is at-least-once (acknowledged with `NO_ACKNOWLEDGEMENT`).
    """

    __slots__ = ("proto",)

    def __init__(self, proto: P) -> None:
        self.proto = proto

    def get_uuid(self) -> int | None:
        kind = proto_uuid_kind(type(self.proto))
        if kind == _TEXT_UUID:
            return uuid_from_text(getattr(self.proto, UUID_FIELD))
        if kind == _BYTES_UUID:
            raw: bytes = getattr(self.proto, UUID_FIELD)
            if not raw:
                return None
            if len(raw) != 16:
                raise ValidationError(UUID_FIELD, f"expected 16 bytes, got {len(raw)}")
            u = int.from_bytes(raw, "big")
            return u if is_v1(u) else parse(u)
        return None

    def set_uuid(self, uuid: int) -> None:
        kind = proto_uuid_kind(type(self.proto))
        if kind == _TEXT_UUID:
            setattr(self.proto, UUID_FIELD, to_str(uuid))
        elif kind == _BYTES_UUID:
            setattr(self.proto, UUID_FIELD, uuid.to_bytes(16, "big"))

    def new_acknowledgement(self, journal: str) -> ProtoMessage[P] | NoAcknowledgement:
        cls = type(self.proto)
        if proto_uuid_kind(cls) == _NO_UUID:
            return NO_ACKNOWLEDGEMENT
        return ProtoMessage(cls())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtoMessage) and self.proto == other.proto

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        text = str(self.proto).replace("\n", " ").strip()
        return f"ProtoMessage({type(self.proto).__name__}({text}))"
