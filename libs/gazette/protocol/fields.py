"""Strict reading of untrusted mappings (YAML, JSON, CRDs) into typed fields.

Every spec's ``from_dict`` reads through a `FieldReader`, so each wrong type, missing field
or unknown key is reported the same way: a `ValidationError` naming the field's full path.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypeVar

from gazette.errors import ValidationError, short_repr
from gazette.protocol.durations import MAX_DURATION, format_duration, parse_duration

T = TypeVar("T")

#: Largest value of a protobuf ``int64`` field (offsets, rates): the bound of any count
#: that has no smaller natural one, so every valid spec can be encoded.
INT64_MAX = (1 << 63) - 1

_MISSING: Any = object()


def join_field(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


class FieldReader:
    """Reads fields of one mapping; `done()` rejects keys nobody asked for."""

    def __init__(self, data: object, field: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ValidationError(field, f"expected a mapping, got {type_name(data)}")
        for key in data:
            if not isinstance(key, str):
                raise ValidationError(field, f"keys must be strings, got {short_repr(key)}")
        self._data: Mapping[str, Any] = data
        self._field = field
        self._seen: set[str] = set()

    def field(self, key: str) -> str:
        return join_field(self._field, key)

    def has(self, key: str) -> bool:
        return key in self._data and self._data[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        """The value as given; None counts as absent."""
        self._seen.add(key)
        value = self._data.get(key)
        if value is None:
            if default is _MISSING:
                raise ValidationError(self.field(key), "is required")
            return default
        return value

    def string(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, _MISSING if default is None else default)
        if not isinstance(value, str):
            raise ValidationError(self.field(key), f"expected a string, got {type_name(value)}")
        return value

    def integer(self, key: str, default: int, lo: int | None = None, hi: int | None = None,
                unit: str = "") -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(
                self.field(key), f"expected an integer, got {type_name(value)} {short_repr(value)}"
            )
        check_range(value, self.field(key), lo, hi, unit)
        return value

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ValidationError(
                self.field(key),
                f"expected true or false, got {type_name(value)} {short_repr(value)}",
            )
        return value

    def duration(self, key: str, default: timedelta) -> timedelta:
        return parse_duration(self.raw(key, default), self.field(key))

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise ValidationError(
                self.field(unknown[0] or '""'),  # an empty key still needs a visible name
                f"unknown field (known: {', '.join(sorted(self._seen))})",
            )


def check_range(value: int, field: str, lo: int | None, hi: int | None, unit: str = "") -> None:
    """`value` is an integer (not a bool) within [`lo`, `hi`]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            field, f"expected an integer, got {type_name(value)} {short_repr(value)}")
    suffix = f" {unit}" if unit else ""
    if lo is not None and value < lo:
        raise ValidationError(field, f"must be at least {lo}{suffix}, got {short_repr(value)}")
    if hi is not None and value > hi:
        raise ValidationError(field, f"must be at most {hi}{suffix}, got {short_repr(value)}")


def check_duration(value: timedelta, field: str, lo: timedelta | None = None,
                   hi: timedelta | None = None, zero_ok: bool = False) -> None:
    """`value` is a duration within [`lo`, `hi`] (`hi` is at most `MAX_DURATION`), or zero
    if `zero_ok`."""
    if not isinstance(value, timedelta):
        raise ValidationError(field, f"expected a duration, got {type_name(value)}")
    hi = MAX_DURATION if hi is None else min(hi, MAX_DURATION)
    if zero_ok and value == timedelta(0):
        return
    if lo is not None and value < lo:
        what = f"0 (disabled) or at least {format_duration(lo)}" if zero_ok else (
            f"at least {format_duration(lo)}")
        raise ValidationError(field, f"must be {what}, got {format_duration(value)}")
    if hi is not None and value > hi:
        raise ValidationError(
            field, f"must be at most {format_duration(hi)}, got {format_duration(value)}"
        )


def build(cls: type[T], field: str, **values: Any) -> T:
    """Construct a self-validating spec, reporting its errors under `field`."""
    try:
        return cls(**values)
    except ValidationError as err:
        raise err.within(field) from None
