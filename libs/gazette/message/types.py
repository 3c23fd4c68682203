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

Adapters: `message_type(cls)` returns the `MessageType` of a class: how to make messages
of it from decoded builtins (a dict from JSON, a list of strings from CSV, bytes of a
protobuf) and back. Framings take it as their ``message_type=`` option.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, final

import msgspec
from google.protobuf.message import DecodeError as _ProtoDecodeError
from google.protobuf.message import Message as _ProtoBase

from gazette.errors import ValidationError, short_repr
from gazette.message.uuid import Flags, flags_of, is_v1, parse, to_str

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "NO_ACKNOWLEDGEMENT",
    "UUID_FIELD",
    "AtLeastOnce",
    "CsvRecord",
    "DataclassMessage",
    "JsonMessage",
    "MessageType",
    "NoAcknowledgement",
    "ProtoMessage",
    "PydanticMessage",
    "check_uuid_texts",
    "message_type",
    "to_builtins",
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


def check_uuid_texts(values: Sequence[object], field: str = UUID_FIELD) -> None:
    """Validate many ``uuid`` field values as `uuid_from_text` does, raising on the first
    bad one. All-canonical batches are checked at once, in a few C-level passes."""
    n = len(values)
    if not n:
        return
    try:
        text = "".join(values).encode("ascii")  # type: ignore[arg-type]
    except (TypeError, UnicodeEncodeError):
        text = b""
    if (len(text) == 36 * n and min(map(len, values)) == 36  # type: ignore[arg-type]
            and not text.translate(None, _HEX_AND_DASH)
            and text.count(b"-") == 4 * n
            and text[8::36].count(b"-") == n and text[13::36].count(b"-") == n
            and text[18::36].count(b"-") == n and text[23::36].count(b"-") == n
            and text[14::36].count(b"1") == n
            and not text[19::36].translate(None, b"89abAB")):
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


class _UuidText:
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
class DataclassMessage(_UuidText):
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
    class PydanticMessage(_UuidText, BaseModel):
        """Base of pydantic v2 messages (see `_define_pydantic_message`)."""

        uuid: str | None = None

        @classmethod
        def acknowledgement(cls, journal: str) -> Self:
            return cls.model_construct()


def _define_pydantic_message() -> type:
    from pydantic import BaseModel

    class PydanticMessage(_UuidText, BaseModel):
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


def _proto_uuid_kind(cls: type[_ProtoBase]) -> int:
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
        kind = _proto_uuid_kind(type(self.proto))
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
        kind = _proto_uuid_kind(type(self.proto))
        if kind == _TEXT_UUID:
            setattr(self.proto, UUID_FIELD, to_str(uuid))
        elif kind == _BYTES_UUID:
            setattr(self.proto, UUID_FIELD, uuid.to_bytes(16, "big"))

    def new_acknowledgement(self, journal: str) -> ProtoMessage[P] | NoAcknowledgement:
        cls = type(self.proto)
        if _proto_uuid_kind(cls) == _NO_UUID:
            return NO_ACKNOWLEDGEMENT
        return ProtoMessage(cls())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtoMessage) and self.proto == other.proto

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        text = str(self.proto).replace("\n", " ").strip()
        return f"ProtoMessage({type(self.proto).__name__}({text}))"


# -- Adapters --------------------------------------------------------------------------

class MessageType(Generic[M]):
    """How a framing makes messages of one type from what it decodes, and back.

    - `from_builtins`: from a dict (a JSON object) or a list of strings (a CSV record);
    - `from_decoded` / `from_decoded_many`: from values decoded as `json_type` (the type
      the JSON framing asks msgspec to decode each document into: ``dict``, or the
      message class itself when msgspec can build it directly);
    - `from_protobuf`: from the bytes of a protobuf message (protobuf types only);
    - `to_builtins`: a message back to builtins (a dict, or a list for CSV records).

    The ``from_*`` methods also validate the message UUID, and raise ValidationError
    with a reason for any value that does not make a valid message.
    """

    __slots__ = ("cls", "json_type", "proto_class")

    def __init__(self, cls: Any, json_type: Any) -> None:
        self.cls = cls
        self.json_type = json_type
        #: The protobuf message class of protobuf types (for the fixed framing), or None.
        self.proto_class: type[_ProtoBase] | None = None

    def from_builtins(self, value: Any) -> M:
        raise NotImplementedError

    def to_builtins(self, message: M) -> Any:
        raise NotImplementedError

    def from_decoded(self, value: Any) -> M:
        return self.from_builtins(value)

    def from_decoded_many(self, values: list[Any]) -> list[M]:
        return [self.from_decoded(v) for v in values]

    def from_protobuf(self, data: bytes | memoryview) -> M:
        raise ValidationError("message_type", f"{_name(self.cls)} is not a protobuf message")

    def __repr__(self) -> str:
        return f"message_type({_name(self.cls)})"


def _name(t: Any) -> str:
    if typing.get_origin(t) is not None:  # AtLeastOnce[Point], list[int]...
        return repr(t).replace(f"{__name__}.", "")
    return getattr(t, "__qualname__", None) or repr(t)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return type(value).__name__


def _uuid_check(cls: type, check: bool) -> Callable[[Any], object] | None:
    """How to validate the UUID of a message of `cls` (None: do not)."""
    if not check:
        return None
    if issubclass(cls, _UuidText):
        return lambda m: uuid_from_text(m.uuid)
    return lambda m: m.get_uuid()


def _check_many(cls: type, check: bool, messages: list[Any]) -> None:
    if not check:
        return
    if issubclass(cls, _UuidText):
        check_uuid_texts(list(map(attrgetter(UUID_FIELD), messages)))
    else:
        for m in messages:
            m.get_uuid()


class _DictType(MessageType[M]):
    """dict subclasses, such as JsonMessage: the decoded dict is copied into one."""

    __slots__ = ("check",)

    def __init__(self, cls: type, check: bool) -> None:
        super().__init__(cls, dict)
        self.check = check

    def from_builtins(self, value: Any) -> M:
        if not isinstance(value, dict):
            raise ValidationError("", f"expected a JSON object, got {_kind(value)}")
        msg: M = self.cls(value)
        if self.check:
            uuid_from_text(value.get(UUID_FIELD))
        return msg

    def from_decoded_many(self, values: list[Any]) -> list[M]:
        msgs: list[M] = list(map(self.cls, values))
        if self.check:
            check_uuid_texts(list(map(dict.get, values, repeat(UUID_FIELD))))
        return msgs

    def to_builtins(self, message: M) -> Any:
        return message


class _ListType(MessageType[M]):
    """list subclasses, such as CsvRecord: a record of strings, column 0 the UUID."""

    __slots__ = ("check",)

    def __init__(self, cls: type, check: bool) -> None:
        super().__init__(cls, list[str])
        self.check = check

    def from_builtins(self, value: Any) -> M:
        if not isinstance(value, list) or not all(type(v) is str for v in value):
            raise ValidationError("", f"expected a list of strings, got {short_repr(value)}")
        if self.check and value:
            uuid_from_text(value[0], "[0]")
        msg: M = self.cls(value)
        return msg

    def to_builtins(self, message: M) -> Any:
        return list(message)  # type: ignore[call-overload]


def _field_names(cls: type) -> list[str]:
    info = msgspec.inspect.type_info(cls)
    return [f.name for f in getattr(info, "fields", ())]


def _row_to_dict(names: list[str], row: list[Any], cls: type) -> dict[str, Any]:
    """A CSV record as fields by name, in field order. An empty ``uuid`` column is None
    (CSV writes None as an empty column)."""
    if len(row) > len(names):
        raise ValidationError(
            "", f"{len(row)} columns, but {_name(cls)} has {len(names)} fields")
    fields = dict(zip(names, row, strict=False))
    if fields.get(UUID_FIELD) == "":
        fields[UUID_FIELD] = None
    return fields


class _MsgspecType(MessageType[M]):
    """Classes msgspec builds directly: dataclasses, msgspec Structs, attrs classes."""

    __slots__ = ("check", "names", "uuid_check")

    def __init__(self, cls: type, check: bool) -> None:
        super().__init__(cls, cls)
        self.check = check
        self.names = _field_names(cls)
        self.uuid_check = _uuid_check(cls, check)

    def from_builtins(self, value: Any) -> M:
        try:
            if isinstance(value, list):  # a CSV record: strings, columns in field order
                msg: M = msgspec.convert(
                    _row_to_dict(self.names, value, self.cls), self.cls, strict=False)
            elif isinstance(value, dict):
                msg = msgspec.convert(value, self.cls)
            else:
                raise ValidationError("", f"expected a JSON object, got {_kind(value)}")
        except msgspec.ValidationError as exc:
            raise ValidationError("", str(exc)) from None
        return self.from_decoded(msg)

    def from_decoded(self, value: Any) -> M:
        if self.uuid_check is not None:
            self.uuid_check(value)
        msg: M = value
        return msg

    def from_decoded_many(self, values: list[Any]) -> list[M]:
        _check_many(self.cls, self.check, values)
        return values

    def to_builtins(self, message: M) -> Any:
        return msgspec.to_builtins(message)


def _is_pydantic(cls: type) -> bool:
    mod = sys.modules.get("pydantic")
    return mod is not None and issubclass(cls, mod.BaseModel)


def _pydantic_reason(exc: Any) -> tuple[str, str]:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return where, f"{first.get('msg', 'invalid')}{more}"


class _PydanticType(MessageType[M]):
    """pydantic v2 models: ``model_validate`` / ``model_dump(mode="json")``."""

    __slots__ = ("check", "names", "uuid_check")

    def __init__(self, cls: type[BaseModel], check: bool) -> None:
        super().__init__(cls, dict)
        self.check = check
        self.names = list(cls.model_fields)
        self.uuid_check = _uuid_check(cls, check)

    def from_builtins(self, value: Any) -> M:
        from pydantic import ValidationError as PydanticError

        if isinstance(value, list):
            value = _row_to_dict(self.names, value, self.cls)
        elif not isinstance(value, dict):
            raise ValidationError("", f"expected a JSON object, got {_kind(value)}")
        try:
            msg: M = self.cls.model_validate(value)
        except PydanticError as exc:
            ack = self._acknowledgement(value)
            if ack is None:
                raise ValidationError(*_pydantic_reason(exc)) from None
            msg = ack
        if self.uuid_check is not None:
            self.uuid_check(msg)
        return msg

    def _acknowledgement(self, value: dict[str, Any]) -> Any:
        """A read ACK that does not validate (see PydanticMessage), else None."""
        if not (self.check and issubclass(self.cls, _UuidText)):
            return None
        try:
            u = uuid_from_text(value.get(UUID_FIELD))
        except ValidationError:
            return None
        if u is None or flags_of(u) != Flags.ACK_TXN:
            return None
        return self.cls.model_construct(uuid=value[UUID_FIELD])

    def to_builtins(self, message: M) -> Any:
        return message.model_dump(mode="json")  # type: ignore[attr-defined]


class _ProtoType(MessageType[M]):
    """Generated protobuf classes: wrapped in ProtoMessage (or raw, inside AtLeastOnce)."""

    __slots__ = ("wrap",)

    def __init__(self, cls: type[_ProtoBase], wrap: bool) -> None:
        super().__init__(cls, dict)
        self.wrap = wrap
        self.proto_class = cls
        if wrap:
            _proto_uuid_kind(cls)  # a `uuid` field of the wrong type fails here

    def _done(self, proto: _ProtoBase) -> M:
        if not self.wrap:
            raw: M = proto  # type: ignore[assignment]
            return raw
        msg = ProtoMessage(proto)
        msg.get_uuid()
        wrapped: M = msg  # type: ignore[assignment]
        return wrapped

    def from_protobuf(self, data: bytes | memoryview) -> M:
        try:
            proto = self.cls.FromString(data)
        except (_ProtoDecodeError, RecursionError, ValueError) as exc:
            raise ValidationError(
                "", f"not a valid {self.cls.DESCRIPTOR.full_name}: {exc}") from None
        return self._done(proto)

    def from_builtins(self, value: Any) -> M:
        from google.protobuf import json_format

        if not isinstance(value, dict):
            raise ValidationError("", f"expected a JSON object, got {_kind(value)}")
        try:
            proto = json_format.ParseDict(value, self.cls())
        except (json_format.ParseError, ValueError, TypeError) as exc:
            raise ValidationError("", str(exc)) from None
        return self._done(proto)

    def to_builtins(self, message: M) -> Any:
        from google.protobuf import json_format

        proto = message.proto if isinstance(message, ProtoMessage) else message
        return json_format.MessageToDict(proto, preserving_proto_field_name=True)  # type: ignore[arg-type]


class _PlainType(MessageType[M]):
    """Builtin types (inside AtLeastOnce): ``dict``, ``list[int]``, ``Any``..."""

    __slots__ = ()

    def __init__(self, t: Any) -> None:
        try:
            msgspec.json.Decoder(t)
        except TypeError as exc:
            raise ValidationError("message_type", f"{_name(t)}: {exc}") from None
        super().__init__(t, t)

    def from_builtins(self, value: Any) -> M:
        try:
            msg: M = msgspec.convert(value, self.cls)
        except msgspec.ValidationError as exc:
            raise ValidationError("", str(exc)) from None
        return msg

    def from_decoded(self, value: Any) -> M:
        msg: M = value
        return msg

    def from_decoded_many(self, values: list[Any]) -> list[M]:
        return values

    def to_builtins(self, message: M) -> Any:
        return message


class _AtLeastOnceType(MessageType[AtLeastOnce[Any]]):
    """AtLeastOnce[T]: values of T, wrapped."""

    __slots__ = ("inner",)

    def __init__(self, cls: Any, inner: MessageType[Any]) -> None:
        super().__init__(cls, inner.json_type)
        self.inner = inner
        self.proto_class = inner.proto_class

    def from_builtins(self, value: Any) -> AtLeastOnce[Any]:
        return AtLeastOnce(self.inner.from_builtins(value))

    def from_decoded(self, value: Any) -> AtLeastOnce[Any]:
        return AtLeastOnce(self.inner.from_decoded(value))

    def from_decoded_many(self, values: list[Any]) -> list[AtLeastOnce[Any]]:
        return list(map(AtLeastOnce, self.inner.from_decoded_many(values)))

    def from_protobuf(self, data: bytes | memoryview) -> AtLeastOnce[Any]:
        return AtLeastOnce(self.inner.from_protobuf(data))

    def to_builtins(self, message: AtLeastOnce[Any]) -> Any:
        return self.inner.to_builtins(message.value)


_MESSAGE_METHODS = ("get_uuid", "set_uuid", "new_acknowledgement")
_BUILTINS = (dict, list, tuple, str, int, float, bool, bytes, type(None))


def _build(t: Any, as_message: bool) -> MessageType[Any]:
    if t is AtLeastOnce or typing.get_origin(t) is AtLeastOnce:
        args = typing.get_args(t)
        return _AtLeastOnceType(t, _build(args[0] if args else Any, False))
    if isinstance(t, type) and t is not Any and t not in _BUILTINS:
        if issubclass(t, _ProtoBase):
            return _ProtoType(t, wrap=as_message)
        if as_message and not all(callable(getattr(t, n, None)) for n in _MESSAGE_METHODS):
            raise ValidationError("message_type", (
                f"{_name(t)} does not implement Message ({', '.join(_MESSAGE_METHODS)}):"
                " derive it from DataclassMessage or PydanticMessage, or read it"
                f" at-least-once as AtLeastOnce[{_name(t)}]"))
        if issubclass(t, dict):
            return _DictType(t, as_message)
        if issubclass(t, list):
            return _ListType(t, as_message)
        if _is_pydantic(t):
            return _PydanticType(typing.cast("type[BaseModel]", t), as_message)
        if (dataclasses.is_dataclass(t) or issubclass(t, msgspec.Struct)
                or hasattr(t, "__attrs_attrs__")):
            return _MsgspecType(t, as_message)
        raise ValidationError(
            "message_type", f"don't know how to build a {_name(t)} from decoded values: use"
            " a dataclass, a pydantic model, a msgspec Struct, a JsonMessage or a CsvRecord")
    if as_message:
        raise ValidationError("message_type", (
            f"{_name(t)} cannot hold a UUID: use AtLeastOnce[{_name(t)}] to read it"
            " at-least-once, or JsonMessage / CsvRecord"))
    return _PlainType(t)


_MESSAGE_TYPES: dict[Any, MessageType[Any]] = {}
_VALUE_TYPES: dict[Any, MessageType[Any]] = {}


def message_type(t: Any) -> MessageType[Any]:
    """The `MessageType` of a message class (or of ``AtLeastOnce[T]``); a `MessageType`
    is returned as is. ValidationError names what is missing for an unusable type."""
    if isinstance(t, MessageType):
        return t
    try:
        mt = _MESSAGE_TYPES.get(t)
    except TypeError:  # unhashable
        return _build(t, True)
    if mt is None:
        mt = _MESSAGE_TYPES[t] = _build(t, True)
    return mt


def _value_type(t: type) -> MessageType[Any]:
    mt = _VALUE_TYPES.get(t)
    if mt is None:
        mt = _VALUE_TYPES[t] = _build(t, False)
    return mt


def to_builtins(message: Any) -> Any:
    """Any message (or value) as builtins, by its own type: a dict for JsonMessage,
    dataclasses, pydantic models and protobuf messages; a list for CsvRecord; the value
    of an AtLeastOnce. Framings use it to encode messages of whatever type they get."""
    while isinstance(message, AtLeastOnce):
        message = message.value
    if isinstance(message, (dict, list, str, int, float)) or message is None:
        return message
    if isinstance(message, ProtoMessage):
        message = message.proto
    return _value_type(type(message)).to_builtins(message)
