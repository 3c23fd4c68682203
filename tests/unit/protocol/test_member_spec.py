"""Member specs: process ids (zone, suffix), endpoints and item limits."""

from __future__ import annotations

from typing import Any

import pytest

from gazette.errors import ValidationError
from gazette.protocol.member_spec import (
    MAX_ITEM_LIMIT,
    MemberSpec,
    ProcessId,
    data_address,
    validate_endpoint,
)


def member(**changes: Any) -> dict[str, Any]:
    return {"zone": "local", "suffix": "busy-walrus", "endpoint": "http://roland:8080",
            **changes}


def assert_member_error(data: object, field: str, phrase: str) -> None:
    with pytest.raises(ValidationError) as info:
        MemberSpec.from_dict(data)
    assert info.value.field == field, str(info.value)
    assert phrase in info.value.reason, str(info.value)


def test_tutorial_broker_parses_and_round_trips() -> None:
    spec = MemberSpec.from_dict(member())
    assert spec == MemberSpec(ProcessId("local", "busy-walrus"), "http://roland:8080")
    assert spec.item_limit == 1024  # the default limit
    assert str(spec.id) == "local#busy-walrus"
    assert spec.to_dict() == {"zone": "local", "suffix": "busy-walrus",
                              "endpoint": "http://roland:8080", "item_limit": 1024}
    assert MemberSpec.from_dict(spec.to_dict()) == spec


def test_draining_member_has_zero_limit() -> None:
    assert MemberSpec.from_dict(member(item_limit=0)).item_limit == 0


def test_process_ids_order_by_zone_then_suffix() -> None:
    ids = [ProcessId("b", "a"), ProcessId("a", "z"), ProcessId("a", "b")]
    assert sorted(ids) == [ProcessId("a", "b"), ProcessId("a", "z"), ProcessId("b", "a")]


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://roland:8080",
        "https://broker.example.com:443",
        "http://10.0.0.1:1",
        "http://[::1]:8080",
        "http://host:65535/",
    ],
)
def test_valid_endpoints(endpoint: str) -> None:
    assert validate_endpoint(endpoint) == endpoint


@pytest.mark.parametrize(
    ("endpoint", "phrase"),
    [
        ("roland:8080", "must look like http://host:port"),
        ("http://roland", "must look like http://host:port"),
        ("grpc://roland:8080", "must look like http://host:port"),
        ("HTTP://roland:8080", "must look like http://host:port"),
        ("http:roland:8080", "must look like http://host:port"),
        ("http://:8080", "must look like http://host:port"),
        ("http://host:0", "must look like http://host:port"),
        ("", "must look like http://host:port"),
        ("http://host:99999", "is not a URL"),
        ("http://host:port", "is not a URL"),
        ("http://[::1:80", "is not a URL"),
        ("http://host:80/path", "no path, query or fragment"),
        ("http://host:80?q=1", "no path, query or fragment"),
        ("http://host:80#f", "no path, query or fragment"),
        ("http://user:pw@host:80", "user or password"),
        ("http://ho st:80", "whitespace"),
        ("http://host:80\n", "whitespace or control"),
        ("http://ho\tst:80", "whitespace or control"),
    ],
)
def test_invalid_endpoints(endpoint: str, phrase: str) -> None:
    assert_member_error(member(endpoint=endpoint), "endpoint", phrase)


@pytest.mark.parametrize("value", [8080, ["http://h:1"], b"http://h:1"])
def test_endpoint_must_be_a_string(value: object) -> None:
    assert_member_error(member(endpoint=value), "endpoint", "expected a string")
    with pytest.raises(ValidationError, match="expected a URL string"):
        validate_endpoint(value)


@pytest.mark.parametrize(
    ("changes", "field", "phrase"),
    [
        ({"zone": ""}, "zone", "must not be empty"),
        ({"zone": "us east"}, "zone", "invalid character ' '"),
        ({"zone": "us/east"}, "zone", "invalid character '/'"),
        ({"zone": "a#b"}, "zone", "invalid character '#'"),
        ({"zone": "z" * 65}, "zone", "longer than 64"),
        ({"suffix": ""}, "suffix", "must not be empty"),
        ({"suffix": "busy#walrus"}, "suffix", "invalid character '#'"),
        ({"suffix": "a:b"}, "suffix", "invalid character ':'"),
        ({"suffix": "s" * 129}, "suffix", "longer than 128"),
        ({"zone": None}, "zone", "is required"),
        ({"zone": 1}, "zone", "expected a string"),
        ({"item_limit": -1}, "item_limit", "at least 0"),
        ({"item_limit": MAX_ITEM_LIMIT + 1}, "item_limit", "at most 1048576"),
        ({"item_limit": "10"}, "item_limit", "expected an integer"),
        ({"item_limit": True}, "item_limit", "expected an integer"),
        ({"limit": 3}, "limit", "unknown field"),
    ],
)
def test_bad_members(changes: dict[str, Any], field: str, phrase: str) -> None:
    assert_member_error(member(**changes), field, phrase)


def test_missing_fields() -> None:
    assert_member_error({"zone": "z", "suffix": "s"}, "endpoint", "is required")
    assert_member_error({}, "zone", "is required")


@pytest.mark.parametrize("data", [None, [], "zone: a", 1])
def test_non_mapping_input(data: object) -> None:
    assert_member_error(data, "", "expected a mapping")


def test_errors_nest_under_a_given_field() -> None:
    with pytest.raises(ValidationError) as info:
        MemberSpec.from_dict(member(zone="a b"), "members[1]")
    assert info.value.field == "members[1].zone"
    with pytest.raises(ValidationError) as info:
        MemberSpec.from_dict(member(endpoint="x"), "members[1]")
    assert info.value.field == "members[1].endpoint"


# Untyped callers may pass anything: these aliases let the tests do so too.
_ProcessId: Any = ProcessId
_MemberSpec: Any = MemberSpec


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ProcessId("", "s"), "zone"),
        (lambda: _ProcessId("z", 3), "suffix"),
        (lambda: _MemberSpec(("z", "s"), "http://h:1"), "id"),
        (lambda: _MemberSpec(ProcessId("z", "s"), "h:1"), "endpoint"),
        (lambda: _MemberSpec(ProcessId("z", "s"), "http://h:1", item_limit=-5), "item_limit"),
        (lambda: _MemberSpec(ProcessId("z", "s"), "http://h:1", item_limit=1.0), "item_limit"),
    ],
)
def test_direct_construction_is_validated(make: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert info.value.field == field
    assert info.value.reason


@pytest.mark.parametrize("endpoint", ["tcp://h:1", "tls://broker-0.example:8082"])
def test_a_data_endpoint_round_trips(endpoint: str) -> None:
    spec = MemberSpec(ProcessId("z", "s"), "http://h:1", data_endpoint=endpoint)
    assert MemberSpec.from_dict(spec.to_dict()) == spec
    assert data_address(endpoint)[2] == endpoint.startswith("tls")


@pytest.mark.parametrize("endpoint", ["http://h:1", "tcp://h", "tcp:/h:1", "tcp://h:1/x",
                                      "tcp://u@h:1", "tcp://h:1 ", "tcp://h:99999"])
def test_a_bad_data_endpoint_is_refused_naming_the_field(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="data_endpoint") as info:
        MemberSpec(ProcessId("z", "s"), "http://h:1", data_endpoint=endpoint)
    assert "tcp://host:port" in info.value.reason
