"""Adapters: how framings make messages of a type from what they decode, and back.

`message_type(cls)` returns the `MessageType` of a class: how to make messages of it from
decoded builtins (a dict from JSON, a list of strings from CSV, bytes of a protobuf) and
back (`to_builtins`). Framings take it as their ``message_type=`` option. The message
types themselves are in `gazette.message.types`.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
from google.protobuf.message import DecodeError as _ProtoDecodeError
from google.protobuf.message import Message as _ProtoBase

from gazette.errors import ValidationError, short_repr
from gazette.message.uuid import Flags, flags_of

if TYPE_CHECKING:
    from pydantic import BaseModel

from gazette.message.types import (
    UUID_FIELD,
    AtLeastOnce,
    ProtoMessage,
    UuidText,
    canonical_uuid_ints,
    check_uuid_texts,
    proto_uuid_kind,
    uuid_from_text,
)

__all__ = ["MessageType", "message_type", "to_builtins", "value_type"]

T = TypeVar("T")
M = TypeVar("M")

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

    def from_decoded_many_uuids(self, values: list[Any]) -> tuple[list[M], list[int] | None]:
        """`from_decoded_many` and, when this type can tell them in one batch, the
        messages' UUIDs (0 for none), so readers need not parse each UUID again;
        None: ask each message's `get_uuid`."""
        return self.from_decoded_many(values), None

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
    if issubclass(cls, UuidText):
        return lambda m: uuid_from_text(m.uuid)
    return lambda m: m.get_uuid()


def _check_many(cls: type, check: bool, messages: list[Any]) -> None:
    if not check:
        return
    if issubclass(cls, UuidText):
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
        return self.from_decoded_many_uuids(values)[0]

    def from_decoded_many_uuids(self, values: list[Any]) -> tuple[list[M], list[int] | None]:
        msgs: list[M] = list(map(self.cls, values))
        if not self.check:
            return msgs, None
        texts = list(map(dict.get, values, repeat(UUID_FIELD)))
        uuids = canonical_uuid_ints(texts)
        if uuids is None:
            check_uuid_texts(texts)
        return msgs, uuids

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

    def from_decoded_many_uuids(self, values: list[Any]) -> tuple[list[M], list[int] | None]:
        if not self.check:
            return values, None
        if issubclass(self.cls, UuidText):
            texts = list(map(attrgetter(UUID_FIELD), values))
            uuids = canonical_uuid_ints(texts)
            if uuids is None:
                check_uuid_texts(texts)
            return values, uuids
        return self.from_decoded_many(values), None

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
        if not (self.check and issubclass(self.cls, UuidText)):
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
            proto_uuid_kind(cls)  # a `uuid` field of the wrong type fails here

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


def value_type(t: type) -> MessageType[Any]:
    """The `MessageType` of values of `t` that carry no UUID (a model inside a message,
    such as an event's data): validated from builtins, and back."""
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
    return value_type(type(message)).to_builtins(message)
