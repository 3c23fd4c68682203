"""The name a TLS channel checks servers' certificates against, for a list of addresses
(grpc would take the whole list for one host name)."""

from __future__ import annotations

import pytest

from gazette.auth.channels import _server_name

OVERRIDE = "grpc.ssl_target_name_override"


@pytest.mark.parametrize(("target", "host"), [
    ("ipv4:127.0.0.1:1,127.0.0.2:2", "127.0.0.1"),
    ("ipv4:10.0.0.1,10.0.0.2", "10.0.0.1"),
    ("ipv6:[::1]:1,[::2]:2", "::1"),
    ("ipv6:::1,::2", "::1"),
])
def test_a_list_of_addresses_is_checked_against_its_first_host(target: str, host: str
                                                                 ) -> None:
    assert _server_name(target, ()) == [(OVERRIDE, host)]


@pytest.mark.parametrize("target", ["ipv4:127.0.0.1:1", "dns:///brokers:8080",
                                    "127.0.0.1:8080", "unix:/tmp/sock"])
def test_one_address_or_a_name_keeps_grpcs_own_check(target: str) -> None:
    assert _server_name(target, ()) == []


def test_an_explicit_override_wins() -> None:
    assert _server_name("ipv4:127.0.0.1:1,127.0.0.2:2", [(OVERRIDE, "mine")]) == []
