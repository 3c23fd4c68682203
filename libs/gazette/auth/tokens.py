"""Bearer tokens: what a caller may do, signed with one of the cluster's keys.

A token is a JWT signed with HMAC-SHA256 (``alg: HS256``; nothing else is accepted, so a
forged ``alg: none`` header is refused). Its claims:

- ``sub``: who the caller is (logged, never trusted for anything else);
- ``cap``: the capabilities it grants (`Capability` values);
- ``sel``: a label selector limiting the journals or shards it applies to (empty: all),
  matched against their labels with the implicit ``name``/``id`` and ``prefix`` labels,
  so ``prefix=team-a/`` grants only what is named under ``team-a/``;
- ``iat``, ``exp``: when it was issued and when it expires (seconds since the epoch).

Registered claims PyJWT checks are honoured too (``nbf``: not valid before).

`SigningKeys` hold the cluster's keys: the first signs, every one verifies, so keys are
rotated by adding the new one first, then dropping the old one once its tokens expired.
Encoding and verification are PyJWT's (``algorithms=["HS256"]``, ``leeway`` of
`CLOCK_SKEW`); its errors are told as ours (`Unauthenticated`, saying what is wrong).
Tokens issued by this module before it used PyJWT are the same bytes, and verify.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import re
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from jwt.warnings import InsecureKeyLengthWarning

from gazette.errors import GazetteError, ValidationError
from gazette.labels import LabelSet, Selector, parse_selector


class Capability(enum.StrEnum):
    """What a token may do: the journal capabilities, then the shard equivalents."""

    LIST = "list"
    APPLY = "apply"
    READ = "read"
    APPEND = "append"
    REPLICATE = "replicate"
    SHARD_LIST = "shard-list"
    SHARD_APPLY = "shard-apply"
    SHARD_READ = "shard-read"
    #: Applications' own shard methods (`AppServices.add_shard_method`).
    SHARD_CALL = "shard-call"


class AuthError(GazetteError):
    """A request that may not be served; `reason` says why, for the caller."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Unauthenticated(AuthError):
    """No token, or one that is malformed, wrongly signed or expired (gRPC
    UNAUTHENTICATED, HTTP 401)."""


class PermissionDenied(AuthError):
    """A valid token that does not grant this request (gRPC PERMISSION_DENIED, HTTP
    403)."""


#: Tokens longer than this are refused unread.
MAX_TOKEN_BYTES = 8192
#: Seconds of clock skew between the issuer and the verifier that are forgiven.
CLOCK_SKEW = 30.0
#: The one algorithm signed and accepted (a forged ``alg: none`` is refused).
ALGORITHM = "HS256"
#: RFC 7518 asks HS256 keys of 32 bytes; PyJWT warns below that at every use. Keys of
#: 16 bytes and more were accepted before and still are (without the warning).
_RECOMMENDED_KEY_BYTES = 32
_KEY_SPLIT = re.compile(r"[\s,]+")


@dataclass(frozen=True, slots=True)
class Claims:
    """A verified token's grant."""

    subject: str
    capabilities: frozenset[Capability]
    selector: Selector = field(default_factory=lambda: parse_selector(""))
    expires: float = 0.0
    issued: float = 0.0

    def require(self, capability: Capability, what: str) -> None:
        """Raise `PermissionDenied` unless this grant includes `capability`."""
        if capability not in self.capabilities:
            granted = ", ".join(sorted(self.capabilities)) or "none"
            raise PermissionDenied(f"{what} needs the {capability.value!r} capability; "
                                   f"the token of {self.subject!r} grants {granted}")

    @property
    def scoped(self) -> bool:
        """Whether the grant is limited to some items (its selector is not empty)."""
        return bool(len(self.selector.include) or len(self.selector.exclude))

    def allows(self, labels: LabelSet) -> bool:
        """Whether an item with `labels` (implicit labels included) is in scope."""
        return self.selector.matches(labels)

    def require_scope(self, labels: LabelSet, item: str) -> None:
        """Raise `PermissionDenied` unless `item` (with `labels`) is in scope."""
        if not self.selector.matches(labels):
            raise PermissionDenied(f"{item} is outside the token of {self.subject!r}: it "
                                   f"is limited to {self.selector}")


#: The grant of a process without keys: everything (authorization is off).
UNRESTRICTED = Claims("anonymous", frozenset(Capability))


class _NoGrant(Claims):
    """The grant of a request no authentication layer named a caller of: nothing, and
    no item is in scope (`scoped`, `allows` nothing); each check says why."""

    __slots__ = ()
    REASON = ("no authenticated caller (the request reached its handler without passing "
              "an authentication layer)")

    def require(self, capability: Capability, what: str) -> None:
        raise Unauthenticated(f"{what}: {self.REASON}")

    @property
    def scoped(self) -> bool:
        return True

    def allows(self, labels: LabelSet) -> bool:
        return False

    def require_scope(self, labels: LabelSet, item: str) -> None:
        raise Unauthenticated(f"{item}: {self.REASON}")


#: What a request is granted when no authentication layer named its caller.
NO_GRANT: Claims = _NoGrant("nobody", frozenset())


def parse_capabilities(value: object, field_: str = "capabilities"
                       ) -> frozenset[Capability]:
    """Capabilities from a list or a comma-separated string; unknown names are a
    `ValidationError` listing the known ones."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset):
        raise ValidationError(field_, "expected a list of capabilities")
    out = set()
    for item in items:
        name = item.strip() if isinstance(item, str) else item
        if not name:
            continue
        try:
            out.add(Capability(name))
        except ValueError:
            known = ", ".join(c.value for c in Capability)
            raise ValidationError(field_, f"unknown capability {name!r} (known: "
                                  f"{known})") from None
    return frozenset(out)


class SigningKeys:
    """The cluster's HMAC keys: `keys[0]` signs, each verifies. Verified tokens are
    cached (bounded), so a stream of requests with one token costs one HMAC."""

    CACHE_SIZE = 1024

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValidationError("auth.keys", "no signing keys")
        for i, key in enumerate(keys):
            if len(key) < 16:
                raise ValidationError(f"auth.keys[{i}]", f"a key must be at least 16 bytes, "
                                      f"got {len(key)}")
        self.keys = list(keys)
        self._short = any(len(key) < _RECOMMENDED_KEY_BYTES for key in keys)
        self._cache: OrderedDict[str, Claims] = OrderedDict()

    @classmethod
    def parse(cls, text: str, field_: str = "auth.keys") -> SigningKeys:
        """Keys as base64, separated by whitespace or commas."""
        keys = []
        for i, word in enumerate(w for w in _KEY_SPLIT.split(text) if w):
            try:
                keys.append(base64.b64decode(word, validate=True))
            except (binascii.Error, ValueError):
                raise ValidationError(f"{field_}[{i}]", "not base64") from None
        if not keys:
            raise ValidationError(field_, "no keys (expected base64 keys separated by "
                                  "whitespace or commas)")
        return cls(keys)

    @classmethod
    def from_file(cls, path: str | Path, field_: str = "auth.keys-file") -> SigningKeys:
        """The keys of a text file (`parse`); a file that is not one (random bytes put
        there as a key) is refused naming it and saying what it should hold."""
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ValidationError(field_, f"cannot read {path}: "
                                  f"{exc.strerror or exc}") from None
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            raise ValidationError(field_, f"{path} is not text (byte {exc.start} is not "
                                  "ASCII): expected base64 keys separated by whitespace "
                                  "or commas, e.g. the output of `head -c 32 "
                                  "/dev/urandom | base64`") from None
        return cls.parse(text, f"{field_} {path}")

    def issue(self, subject: str, capabilities: frozenset[Capability] | set[Capability],
              selector: str | Selector = "", ttl: float = 3600.0,
              now: float | None = None) -> str:
        """A token for `subject` granting `capabilities` over what `selector` selects,
        valid for `ttl` seconds."""
        if not ttl > 0:
            raise ValidationError("ttl", f"must be > 0 seconds, got {ttl!r}")
        sel = selector if isinstance(selector, Selector) else parse_selector(selector,
                                                                             "selector")
        issued = time.time() if now is None else now
        payload = {"sub": subject, "cap": sorted(c.value for c in capabilities),
                   "sel": str(sel), "iat": int(issued), "exp": int(issued + ttl)}
        with self._short_keys_allowed():
            return jwt.encode(payload, self.keys[0], algorithm=ALGORITHM)

    def verify(self, token: str, now: float | None = None) -> Claims:
        """The claims of `token`, or `Unauthenticated` saying what is wrong with it.
        PyJWT verifies a token new to this cache (its times against the clock); a
        cached one is checked for expiry only, at `now` (default: the clock)."""
        claims = self._cache.get(token)
        if claims is None:
            claims = self._verify(token)
            self._cache[token] = claims
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        if claims.expires + CLOCK_SKEW < (time.time() if now is None else now):
            raise Unauthenticated(f"the token of {claims.subject!r} expired at "
                                  f"{_when(claims.expires)}")
        return claims

    def _verify(self, token: str) -> Claims:
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthenticated(f"the token is too long ({len(token)} bytes)")
        if token.count(".") != 2:
            raise Unauthenticated("the token is not a JWT (header.payload.signature)")
        for key in self.keys:
            try:
                with self._short_keys_allowed():
                    payload = jwt.decode(token, key, algorithms=[ALGORITHM],
                                         leeway=CLOCK_SKEW, options={"require": ["exp"]})
            except jwt.InvalidSignatureError:
                continue  # another key may have signed it
            except jwt.PyJWTError as err:
                raise Unauthenticated(_reason(err, token)) from None
            return _claims(payload)
        raise Unauthenticated("the token's signature matches none of this cluster's "
                              "keys (wrongly signed, or signed with a retired key)")

    @contextlib.contextmanager
    def _short_keys_allowed(self) -> Iterator[None]:
        if self._short:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", InsecureKeyLengthWarning)
                yield
        else:
            yield


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _unverified(token: str) -> dict[str, Any]:
    """The payload of a token whose signature PyJWT verified but which it refused for
    a claim (for the reason's subject and times)."""
    try:
        payload = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return {}
    return payload if isinstance(payload, dict) else {}


def unverified_claims(token: str) -> Claims:
    """What `token` says it grants, its signature unchecked: for a client that shows
    only what its token would allow (servers verify); `Unauthenticated` if it is no
    token."""
    if token.count(".") != 2 or not _unverified(token):
        raise Unauthenticated("the token is not a JWT (header.payload.signature)")
    return _claims(_unverified(token))


def _reason(err: jwt.PyJWTError, token: str) -> str:
    """What PyJWT's refusal `err` of `token` means, as this module has always said it."""
    text = str(err)
    if isinstance(err, jwt.ExpiredSignatureError | jwt.ImmatureSignatureError):
        payload = _unverified(token)
        who = payload.get("sub", "")
        if isinstance(err, jwt.ExpiredSignatureError):
            return f"the token of {who!r} expired at {_when(float(payload['exp']))}"
        if "(nbf)" in text:
            return f"the token of {who!r} is not valid before {_when(float(payload['nbf']))}"
        return f"the token of {who!r} is issued in the future"
    if isinstance(err, jwt.InvalidAlgorithmError):
        return f"the token's alg must be {ALGORITHM}"
    if isinstance(err, jwt.MissingRequiredClaimError) or "(exp)" in text:
        return "the token has no expiry (exp) or a bad one"
    if isinstance(err, jwt.InvalidIssuedAtError):
        return "the token's issue time (iat) is not a number"
    if isinstance(err, jwt.exceptions.InvalidSubjectError):
        return "the token's sub and sel must be strings"
    if "(nbf)" in text:
        return "the token's not-before time (nbf) is not a number"
    if "payload" in text and "json object" in text:
        return "the token's payload is not an object"
    if isinstance(err, jwt.DecodeError):
        return "the token is not a JWT: bad base64 or JSON"
    return f"the token is invalid: {text}"


def _claims(payload: object) -> Claims:
    """Claims from a signed payload (signed, yet checked: a key may be misused)."""
    if not isinstance(payload, dict):
        raise Unauthenticated("the token's payload is not an object")
    subject, caps, sel = payload.get("sub", ""), payload.get("cap", []), payload.get("sel", "")
    expires, issued = payload.get("exp"), payload.get("iat", 0)
    if not isinstance(subject, str) or not isinstance(sel, str):
        raise Unauthenticated("the token's sub and sel must be strings")
    if not isinstance(expires, int | float) or not isinstance(issued, int | float):
        raise Unauthenticated("the token has no expiry (exp) or a bad one")
    try:
        return Claims(subject, parse_capabilities(caps, "cap"),
                      parse_selector(sel, "sel"), float(expires), float(issued))
    except ValidationError as err:
        raise Unauthenticated(f"the token's claims are malformed: {err}") from None


class ServiceToken:
    """A member's own token (for what it does itself: a primary's Replicate streams, a
    consumer's reads and appends), minted from the cluster's keys and minted again once
    half its lifetime has passed."""

    TTL = 3600.0

    def __init__(self, keys: SigningKeys, subject: str,
                 capabilities: frozenset[Capability]) -> None:
        self.keys, self.subject, self.capabilities = keys, subject, capabilities
        self._token, self._renew_at = "", 0.0

    def current(self) -> str:
        now = time.time()
        if now >= self._renew_at:
            self._token = self.keys.issue(self.subject, self.capabilities, ttl=self.TTL,
                                          now=now)
            self._renew_at = now + self.TTL / 2
        return self._token
