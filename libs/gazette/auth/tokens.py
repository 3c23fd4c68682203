"""Bearer tokens: what a caller may do, signed with one of the cluster's keys.

A token is a JWT signed with HMAC-SHA256 (``alg: HS256``; nothing else is accepted, so a
forged ``alg: none`` header is refused). Its claims:

- ``sub``: who the caller is (logged, never trusted for anything else);
- ``cap``: the capabilities it grants (`Capability` values);
- ``sel``: a label selector limiting the journals or shards it applies to (empty: all),
  matched against their labels with the implicit ``name``/``id`` and ``prefix`` labels,
  so ``prefix=team-a/`` grants only what is named under ``team-a/``;
- ``iat``, ``exp``: when it was issued and when it expires (seconds since the epoch).

`SigningKeys` hold the cluster's keys: the first signs, every one verifies, so keys are
rotated by adding the new one first, then dropping the old one once its tokens expired.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

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
_HEADER = {"alg": "HS256", "typ": "JWT"}
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


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


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
        head = _b64encode(json.dumps(_HEADER, separators=(",", ":")).encode())
        body = _b64encode(json.dumps(payload, separators=(",", ":")).encode())
        signed = f"{head}.{body}".encode()
        mac = hmac.new(self.keys[0], signed, hashlib.sha256).digest()
        return f"{head}.{body}.{_b64encode(mac)}"

    def verify(self, token: str, now: float | None = None) -> Claims:
        """The claims of `token`, or `Unauthenticated` saying what is wrong with it."""
        now = time.time() if now is None else now
        claims = self._cache.get(token)
        if claims is None:
            claims = self._verify(token)
            self._cache[token] = claims
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
        if claims.expires + CLOCK_SKEW < now:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claims.expires))
            raise Unauthenticated(f"the token of {claims.subject!r} expired at {when}")
        if claims.issued - CLOCK_SKEW > now:
            raise Unauthenticated(f"the token of {claims.subject!r} is issued in the future")
        return claims

    def _verify(self, token: str) -> Claims:
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthenticated(f"the token is too long ({len(token)} bytes)")
        parts = token.split(".")
        if len(parts) != 3:
            raise Unauthenticated("the token is not a JWT (header.payload.signature)")
        try:
            header = json.loads(_b64decode(parts[0]))
            payload = json.loads(_b64decode(parts[1]))
            mac = _b64decode(parts[2])
        except (ValueError, binascii.Error):
            raise Unauthenticated("the token is not a JWT: bad base64 or JSON") from None
        if not isinstance(header, dict) or header.get("alg") != "HS256":
            raise Unauthenticated("the token's alg must be HS256")
        signed = f"{parts[0]}.{parts[1]}".encode()
        if not any(hmac.compare_digest(hmac.new(k, signed, hashlib.sha256).digest(), mac)
                   for k in self.keys):
            raise Unauthenticated("the token's signature matches none of this cluster's "
                                  "keys (wrongly signed, or signed with a retired key)")
        return _claims(payload)


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
