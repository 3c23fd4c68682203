"""Durations: Go-like text (``1m0s``) in, one canonical text out."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.protocol.durations import MAX_DURATION, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1m0s", timedelta(minutes=1)),
        ("1h0m0s", timedelta(hours=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("500ms", timedelta(milliseconds=500)),
        ("250us", timedelta(microseconds=250)),
        ("250µs", timedelta(microseconds=250)),
        ("1.5s", timedelta(seconds=1.5)),
        (".5s", timedelta(milliseconds=500)),
        ("1.s", timedelta(seconds=1)),
        ("0", timedelta(0)),
        ("-0", timedelta(0)),  # as Go's time.ParseDuration
        ("+0", timedelta(0)),
        ("0s", timedelta(0)),
        ("+5s", timedelta(seconds=5)),
        (" 10m ", timedelta(minutes=10)),
        ("1m1m", timedelta(minutes=2)),  # Go sums repeated units too
        ("876000h", MAX_DURATION),
    ],
)
def test_parse_text(text: str, expected: timedelta) -> None:
    assert parse_duration(text, "d") == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, timedelta(0)),
        (90, timedelta(seconds=90)),
        (0.25, timedelta(milliseconds=250)),
        (timedelta(minutes=5), timedelta(minutes=5)),
    ],
)
def test_parse_numbers_as_seconds_and_timedeltas(value: object, expected: timedelta) -> None:
    assert parse_duration(value, "d") == expected


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ("", "expected a duration"),
        ("   ", "expected a duration"),
        ("garbage", "is not a duration"),
        ("10", "is not a duration"),  # a unit is required, except for "0"
        ("1d", "is not a duration"),
        ("1ns", "is not a duration"),
        ("1e3s", "is not a duration"),
        ("1 m", "is not a duration"),
        ("-", "is not a duration"),
        ("+", "is not a duration"),
        ("--1s", "is not a duration"),
        ("1s-", "is not a duration"),
        ("\u0661s", "is not a duration"),  # ARABIC-INDIC DIGIT ONE: ASCII digits only
        ("-1s", "must not be negative"),
        ("-1m30s", "must not be negative"),
        (-5, "must not be negative"),
        (-0.5, "must not be negative"),
        (timedelta(seconds=-1), "must not be negative"),
        ("876001h", "longer than 100 years"),
        ("9" * 400 + "h", "longer than 100 years"),
        (10**12, "longer than 100 years"),
        (10**400, "longer than 100 years"),  # math.isfinite(int) would overflow
        (-(10**400), "longer than 100 years"),
        pytest.param(10**5000, "-bit integer", id="10**5000"),  # past int-to-str's limit
        (1e300, "longer than 100 years"),
        (timedelta.max, "longer than 100 years"),
        (math.inf, "finite"),
        (-math.inf, "finite"),
        (math.nan, "finite"),
        (True, "expected a duration"),
        (False, "expected a duration"),
        (None, "expected a duration"),
        ([1], "expected a duration"),
        ({"s": 1}, "expected a duration"),
        (b"1s", "expected a duration"),
    ],
)
def test_parse_errors_name_the_field(value: object, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_duration(value, "fragment.refresh_interval")
    assert info.value.field == "fragment.refresh_interval"
    assert phrase in info.value.reason, info.value.reason


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(microseconds=1), "1us"),
        (timedelta(microseconds=1500), "1500us"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(seconds=1), "1s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=30), "30s"),
        (timedelta(minutes=1), "1m0s"),
        (timedelta(minutes=1, seconds=0.5), "1m0.5s"),
        (timedelta(minutes=5), "5m0s"),
        (timedelta(hours=1), "1h0m0s"),
        (timedelta(hours=25, minutes=1, seconds=1), "25h1m1s"),
        (timedelta(seconds=-90), "-1m30s"),
        (timedelta(milliseconds=-5), "-5ms"),
    ],
)
def test_format_is_canonical(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=MAX_DURATION // timedelta(microseconds=1)))
def test_format_then_parse_round_trips(micros: int) -> None:
    value = timedelta(microseconds=micros)
    assert parse_duration(format_duration(value), "d") == value


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789.hmsuµ+- ", max_size=12))
def test_parse_text_never_escapes(text: str) -> None:
    try:
        result = parse_duration(text, "d")
    except ValidationError as err:
        assert err.field == "d" and err.reason
    else:
        assert timedelta(0) <= result <= MAX_DURATION
