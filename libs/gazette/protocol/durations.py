"""Durations in the Go-like text form specs use (``1m0s``, ``500ms``, ``1h30m``).

Specs are written by people in YAML, so durations are text; we parse them into
`timedelta` and format them back in one canonical form (``1h0m0s``, ``30s``, ``250ms``).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from gazette.errors import ValidationError, short_repr

_UNITS_US = {
    "h": 3_600_000_000,
    "m": 60_000_000,
    "s": 1_000_000,
    "ms": 1_000,
    "us": 1,
    "µs": 1,
}
#: ASCII digits only: ``\d`` would also take the digits of other scripts.
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(h|ms|us|µs|m|s)")
#: Longest duration we accept: larger values are surely mistakes (and overflow timedelta).
MAX_DURATION = timedelta(days=365 * 100)


def parse_duration(value: object, field: str) -> timedelta:
    """A duration from text (``1m30s``), a number of seconds, or a `timedelta`."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool):
        raise ValidationError(field, f"expected a duration like '1m0s', got {short_repr(value)}")
    elif isinstance(value, int | float):
        # Not math.isfinite(int): it converts to float, and overflows past 1e308.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValidationError(field, f"expected a finite duration, got {short_repr(value)}")
        if abs(value) > MAX_DURATION.total_seconds():
            raise ValidationError(field, f"{short_repr(value)} seconds is longer than 100 years")
        result = timedelta(seconds=value)
    elif isinstance(value, str):
        result = _parse_text(value, field)
    else:
        raise ValidationError(
            field, f"expected a duration like '1m0s', got {type(value).__name__}"
        )
    if result < timedelta(0):
        raise ValidationError(field, f"must not be negative, got {format_duration(result)}")
    if result > MAX_DURATION:
        raise ValidationError(field, f"{format_duration(result)} is longer than 100 years")
    return result


def _parse_text(text: str, field: str) -> timedelta:
    s = text.strip()
    if s in ("0", ""):
        if s == "":
            raise ValidationError(field, "expected a duration like '1m0s', got ''")
        return timedelta(0)
    negative = s.startswith("-")
    body = s[1:] if negative or s.startswith("+") else s
    if body == "0":  # as Go's time.ParseDuration: "-0" and "+0" are zero too
        return timedelta(0)
    pos, micros = 0, 0.0
    while pos < len(body):
        m = _PART.match(body, pos)
        if m is None:
            raise ValidationError(
                field,
                f"{short_repr(text)} is not a duration (use numbers with units h, m, s, ms, us, "
                f"e.g. '1m30s')",
            )
        micros += float(m.group(1)) * _UNITS_US[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise ValidationError(field, f"{short_repr(text)} is not a duration")
    if micros > MAX_DURATION / timedelta(microseconds=1):
        raise ValidationError(field, f"{short_repr(text)} is longer than 100 years")
    result = timedelta(microseconds=round(micros))
    return -result if negative else result


def format_duration(value: timedelta) -> str:
    """Canonical text: ``0s``, ``250ms``, ``1.5s``, ``1m0s``, ``2h0m0s``."""
    us = value // timedelta(microseconds=1)
    if us == 0:
        return "0s"
    sign = "-" if us < 0 else ""
    us = abs(us)
    if us < 1_000_000:
        if us % 1000 == 0:
            return f"{sign}{us // 1000}ms"
        return f"{sign}{us}us"
    hours, rem = divmod(us, 3_600_000_000)
    minutes, rem = divmod(rem, 60_000_000)
    seconds = _format_seconds(rem)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


def _format_seconds(us: int) -> str:
    whole, frac = divmod(us, 1_000_000)
    if not frac:
        return str(whole)
    return f"{whole}.{frac:06d}".rstrip("0")
