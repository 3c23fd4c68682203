"""Member specs: what a broker or consumer process advertises about itself in etcd."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from gazette import names
from gazette.errors import ValidationError, short_repr
from gazette.protocol.fields import FieldReader, build, check_range

ZONE_SYMBOLS = "-_."
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,31}")
MAX_ITEM_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True, order=True)
class ProcessId:
    """A process: its failure zone and a suffix unique within the zone."""

    zone: str
    suffix: str

    def __post_init__(self) -> None:
        names.validate_token(self.zone, "zone", ZONE_SYMBOLS, 1, 64)
        names.validate_token(self.suffix, "suffix", ZONE_SYMBOLS, 1, 128)

    def __str__(self) -> str:
        return f"{self.zone}#{self.suffix}"


def validate_endpoint(value: object, field: str = "endpoint") -> str:
    """Where a member serves gRPC and HTTP: ``http://host:port`` or ``https://...``."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a URL string, got {type(value).__name__}")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        # urlsplit silently drops tabs and newlines: we would check another URL.
        raise ValidationError(field, f"{short_repr(value)} must not contain whitespace or control "
                              "characters")
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValidationError(field, f"{short_repr(value)} is not a URL: {exc}") from None
    if (parts.scheme not in ("http", "https") or not value.startswith(parts.scheme + "://")
            or not parts.hostname or not port):
        raise ValidationError(field, f"{short_repr(value)} must look like http://host:port")
    if parts.username is not None or parts.password is not None:
        raise ValidationError(field, f"{short_repr(value)} must not carry a user or password")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValidationError(field, f"{short_repr(value)} must have no path, query or fragment")
    return value


DATA_SCHEMES = ("tcp", "tls")


def validate_data_endpoint(value: object, field: str = "data_endpoint") -> str:
    """Where a broker serves its data path: ``tcp://host:port`` or ``tls://host:port``."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a URL string, got {type(value).__name__}")
    scheme, sep, rest = value.partition("://")
    try:
        parts = urllib.parse.urlsplit("http://" + rest)
        port = parts.port
    except ValueError:
        port = None
    if (scheme not in DATA_SCHEMES or not sep or not port or not parts.hostname
            or any(ch.isspace() or not ch.isprintable() for ch in value)
            or parts.username is not None or parts.path or parts.query or parts.fragment):
        raise ValidationError(field, f"{short_repr(value)} must look like tcp://host:port "
                              "or tls://host:port")
    return value


def data_address(endpoint: str) -> tuple[str, int, bool]:
    """A data endpoint's host, port and whether it is TLS."""
    scheme, _, rest = validate_data_endpoint(endpoint).partition("://")
    parts = urllib.parse.urlsplit("http://" + rest)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port, scheme == "tls"


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """A broker or consumer process; `item_limit` caps journals or shards it takes
    (0 asks for none, as a draining member does); `store_schemes`: the kinds of
    fragment store (URL schemes) a broker can serve journals of (empty: any)."""

    id: ProcessId
    endpoint: str
    item_limit: int = 1024
    store_schemes: tuple[str, ...] = ()
    #: A broker's data path (`gazette.protocol.frames`): ``tcp://host:port`` or
    #: ``tls://host:port``; "" if it serves none.
    data_endpoint: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, ProcessId):
            raise ValidationError("id", f"expected a ProcessId, got {short_repr(self.id)}")
        validate_endpoint(self.endpoint)
        if self.data_endpoint:
            validate_data_endpoint(self.data_endpoint)
        check_range(self.item_limit, "item_limit", 0, MAX_ITEM_LIMIT)
        if not isinstance(self.store_schemes, tuple) or not all(
                isinstance(s, str) and _SCHEME.fullmatch(s) for s in self.store_schemes):
            raise ValidationError("store_schemes", f"expected lower-case URL schemes, "
                                  f"got {short_repr(self.store_schemes)}")

    def serves_stores(self, urls: tuple[str, ...]) -> bool:
        """Whether this member can serve a journal persisted to the stores `urls`."""
        return not self.store_schemes or all(
            url.partition(":")[0] in self.store_schemes for url in urls)

    @classmethod
    def from_dict(cls, data: object, field: str = "") -> MemberSpec:
        r = FieldReader(data, field)
        zone, suffix = r.string("zone"), r.string("suffix")
        try:
            pid = ProcessId(zone, suffix)
        except ValidationError as err:
            raise err.within(field) from None
        values = {"id": pid, "endpoint": r.string("endpoint"),
                  "item_limit": r.integer("item_limit", 1024, 0, MAX_ITEM_LIMIT),
                  "store_schemes": _schemes(r.raw("store_schemes", []),
                                            r.field("store_schemes")),
                  "data_endpoint": r.string("data_endpoint", "")}
        r.done()
        return build(cls, field, **values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"zone": self.id.zone, "suffix": self.id.suffix,
                               "endpoint": self.endpoint, "item_limit": self.item_limit}
        if self.store_schemes:
            out["store_schemes"] = list(self.store_schemes)
        if self.data_endpoint:
            out["data_endpoint"] = self.data_endpoint
        return out


def _schemes(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(field, f"expected a list of strings, got {short_repr(value)}")
    return tuple(value)
