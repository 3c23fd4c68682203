"""Bearer tokens (`gazette.auth.tokens`, PyJWT underneath) and who a request's caller is
when no authentication layer named one."""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import json
import time

import jwt
import pytest

from gazette.auth import (
    ANONYMOUS,
    Capability,
    SigningKeys,
    Unauthenticated,
    current_caller,
    set_caller,
)
from gazette.labels import EMPTY, journal_labels

KEY = b"gazette-test-key-0123456789abcdef"
#: Issued by the hand-written HS256 code this module replaced (before PyJWT), with KEY,
#: on 2026-01-01 for a hundred years: subject "legacy", append and read, prefix=team-a/.
LEGACY_TOKEN = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJsZWdhY3kiLCJjYXAiOlsiYXBwZW5kIiwicm"
    "VhZCJdLCJzZWwiOiJwcmVmaXg9dGVhbS1hLyIsImlhdCI6MTc2NzIyNTYwMCwiZXhwIjo0OTIyOTg1NjAw"
    "fQ.IXaHweMpr36u99CStKpG47h4Y-oOIppXoxjuXgLVDOw")


def _b64(doc: object) -> str:
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _signed(payload: dict[str, object], key: bytes = KEY,
            headers: dict[str, object] | None = None) -> str:
    return jwt.encode(payload, key, algorithm="HS256", headers=headers)


def _signed_raw(signing_input: str) -> str:
    """`signing_input` (header.payload, whatever they hold) signed with KEY."""
    mac = hmac.new(KEY, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def test_a_token_issued_before_pyjwt_still_verifies() -> None:
    claims = SigningKeys([KEY]).verify(LEGACY_TOKEN)
    assert claims.subject == "legacy"
    assert claims.capabilities == {Capability.APPEND, Capability.READ}
    assert str(claims.selector) == "prefix=team-a/"
    assert (claims.issued, claims.expires) == (1767225600.0, 4922985600.0)
    # And what is issued now is the same token, byte for byte.
    assert SigningKeys([KEY]).issue("legacy", {Capability.READ, Capability.APPEND},
                                    "prefix=team-a/", ttl=4922985600 - 1767225600,
                                    now=1767225600) == LEGACY_TOKEN


def test_tokens_are_pyjwt_tokens_both_ways() -> None:
    keys = SigningKeys([KEY])
    issued = keys.issue("svc", {Capability.LIST}, "app=x", ttl=60)
    decoded = jwt.decode(issued, KEY, algorithms=["HS256"])
    assert (decoded["sub"], decoded["cap"], decoded["sel"]) == ("svc", ["list"], "app=x")
    now = int(time.time())
    foreign = _signed({"sub": "ops", "cap": ["read"], "sel": "", "iat": now,
                       "exp": now + 60, "jti": "x"}, headers={"kid": "k1"})
    assert keys.verify(foreign).capabilities == {Capability.READ}


def test_a_token_not_yet_valid_is_refused() -> None:
    """The registered ``nbf`` claim is honoured (the hand-written code ignored it)."""
    now = int(time.time())
    early = _signed({"sub": "early", "cap": ["read"], "iat": now, "exp": now + 7200,
                     "nbf": now + 3600})
    with pytest.raises(Unauthenticated, match=r"^the token of 'early' is not valid before "
                                              r"\d{4}-\d\d-\d\dT"):
        SigningKeys([KEY]).verify(early)
    # Within the clock skew forgiven, it is valid.
    soon = _signed({"sub": "soon", "cap": ["read"], "iat": now, "exp": now + 7200,
                    "nbf": now + 5})
    assert SigningKeys([KEY]).verify(soon).subject == "soon"


@pytest.mark.parametrize(("token", "reason"), [
    ("x" * 9000, r"^the token is too long \(9000 bytes\)$"),
    ("abc.def", r"^the token is not a JWT \(header\.payload\.signature\)$"),
    ("@@@.@@@.@@@", r"^the token is not a JWT: bad base64 or JSON$"),
    (_signed_raw(_b64({"alg": "HS256"}) + ".bm90IGpzb24"), r"^the token is not a JWT: bad "
                                                           r"base64 or JSON$"),
    (_signed_raw(_b64({"alg": "HS256"}) + "." + _b64([1, 2])),
     r"^the token's payload is not an object$"),
    (_b64({"alg": "none", "typ": "JWT"}) + "." + _b64({"sub": "x", "exp": 9e9}) + ".",
     r"^the token's alg must be HS256$"),
    (jwt.encode({"sub": "x", "exp": 9_000_000_000}, b"k" * 64, algorithm="HS512"),
     r"^the token's alg must be HS256$"),
    (_signed({"sub": "x", "exp": 9_000_000_000}, b"another-key-0123456789abcdef-0123"),
     r"^the token's signature matches none of this cluster's keys \(wrongly signed, or "
     r"signed with a retired key\)$"),
    (_signed({"sub": "old", "cap": [], "iat": 1000, "exp": 2000}),
     r"^the token of 'old' expired at 1970-01-01T00:33:20Z$"),
    (_signed({"sub": "new", "cap": [], "iat": 9_000_000_000, "exp": 9_000_000_600}),
     r"^the token of 'new' is issued in the future$"),
    (_signed({"sub": "x", "cap": []}), r"^the token has no expiry \(exp\) or a bad one$"),
    (_signed({"sub": "x", "exp": "soon"}), r"^the token has no expiry \(exp\) or a bad one$"),
    (_signed({"sub": 7, "exp": 9_000_000_000}), r"^the token's sub and sel must be strings$"),
    (_signed({"sub": "x", "sel": ["a"], "exp": 9_000_000_000}),
     r"^the token's sub and sel must be strings$"),
    (_signed({"sub": "x", "cap": ["fly"], "exp": 9_000_000_000}),
     r"^the token's claims are malformed: cap: unknown capability 'fly'"),
    (_signed({"sub": "x", "sel": "a=(", "exp": 9_000_000_000}),
     r"^the token's claims are malformed: sel"),
], ids=["too-long", "two-parts", "bad-base64", "bad-json", "not-an-object", "alg-none", "alg-hs512",
        "wrong-key", "expired", "future", "no-exp", "bad-exp", "sub-not-string",
        "sel-not-string", "unknown-capability", "bad-selector"])
def test_refusals_say_why(token: str, reason: str) -> None:
    with pytest.raises(Unauthenticated, match=reason):
        SigningKeys([KEY]).verify(token)


def test_every_key_verifies_and_the_first_signs() -> None:
    old, new = b"old-key-0123456789abcdef", b"new-key-0123456789abcdef"
    assert SigningKeys([new, old]).verify(SigningKeys([old]).issue("a", set())).subject \
        == "a"
    issued = SigningKeys([new, old]).issue("b", set())
    assert SigningKeys([new]).verify(issued).subject == "b"
    with pytest.raises(Unauthenticated, match="signature"):
        SigningKeys([old]).verify(issued)


def test_a_cached_token_still_expires() -> None:
    keys = SigningKeys([KEY])
    issued = keys.issue("brief", set(), ttl=1, now=time.time())
    assert keys.verify(issued).subject == "brief"  # now cached
    with pytest.raises(Unauthenticated, match="expired"):
        keys.verify(issued, now=time.time() + 60)


def test_outside_any_request_the_caller_may_do_nothing() -> None:
    """No authentication layer named a caller (a request that reached a handler some
    other way): nothing is granted, no item is in scope, and the reason says so."""
    caller = current_caller()
    assert caller is not ANONYMOUS and caller.token == ""
    with pytest.raises(Unauthenticated, match="no authenticated caller"):
        caller.claims.require(Capability.READ, "Read")
    labels = journal_labels("team-a/orders", EMPTY)
    assert caller.claims.scoped and not caller.claims.allows(labels)
    with pytest.raises(Unauthenticated, match="no authenticated caller"):
        caller.require_scope(labels, "journal team-a/orders")
    # What an authentication layer names (with authorization off: ANONYMOUS) holds.
    def named() -> None:
        set_caller(ANONYMOUS)
        current_caller().claims.require(Capability.READ, "Read")
        current_caller().require_scope(labels, "journal team-a/orders")

    contextvars.copy_context().run(named)
