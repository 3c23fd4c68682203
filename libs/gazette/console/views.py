"""What the pages show, without I/O: query parameters checked into values (a bad one is
a `BadInput` naming the field and the reason), sizes and times for people, routes and
replica statuses as text, bytes shown safely. The templates escape everything; these
only make it readable."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gazette import names
from gazette.client import ListedShard, Route
from gazette.client.connection import MAX_INT64
from gazette.errors import GazetteError, ValidationError, short_repr
from gazette.gazctl.config import bounded_int, parse_time
from gazette.gazctl.output import ago, human_bytes
from gazette.labels import LabelSet, Selector
from gazette.protocol import ReplicaStatus

__all__ = ["BadInput", "NotFound", "ago", "human_bytes"]


class PageError(GazetteError):
    """A request the console cannot answer: `status` (an HTTP code), a `title` and the
    reason, shown on the error page."""

    status = 500
    title = "Error"

    def __init__(self, reason: str, *, field: str = "") -> None:
        self.reason, self.field = reason, field
        super().__init__(f"{field}: {reason}" if field else reason)


class BadInput(PageError):
    """A parameter that is not what it must be: 400, naming it."""

    status = 400
    title = "Bad request"


class NotFound(PageError):
    status = 404
    title = "Not found"


class Forbidden(PageError):
    status = 403
    title = "Forbidden"


def bad(err: ValidationError, field: str) -> BadInput:
    """`err` (the library's check of a value) as a 400 naming `field`."""
    return BadInput(err.reason, field=field)


# -- parameters ------------------------------------------------------------------------


def param(query: Mapping[str, str], name: str, default: str = "") -> str:
    """A query parameter, stripped ("" when absent)."""
    return query.get(name, default).strip()


def _name_param(query: Mapping[str, str], name: str, what: str,
                validate: Callable[[str, str], str]) -> str:
    """A required name, checked as the protocol checks it."""
    value = param(query, name)
    if not value:
        raise BadInput(f"give a {what}", field=name)
    try:
        return validate(value, name)
    except ValidationError as err:
        raise bad(err, name) from None


def journal_param(query: Mapping[str, str], name: str = "journal") -> str:
    return _name_param(query, name, "journal name", names.validate_journal_name)


def shard_param(query: Mapping[str, str], name: str = "id") -> str:
    return _name_param(query, name, "shard ID", names.validate_shard_id)


def selector_param(query: Mapping[str, str], name: str = "selector") -> Selector:
    text = param(query, name)
    try:
        return Selector.parse(text) if text else Selector()
    except ValidationError as err:
        raise BadInput(f"not a label selector ({err.reason}); e.g. prefix=foobar/, "
                       "or name in (a, b), or app.gazette.dev/tag=demo", field=name) from None


def int_param(query: Mapping[str, str], name: str, default: int, lo: int, hi: int,
              what: str, *, above: str = "", below: str = "") -> int:
    """An integer parameter in ``lo..hi`` (gazctl's `bounded_int`: the bound it broke)."""
    text = param(query, name)
    if not text:
        return default
    try:
        return bounded_int(text, what, lo, hi, above=above, below=below)
    except (ValueError, argparse.ArgumentTypeError) as err:
        raise BadInput(str(err), field=name) from None


def offset_param(query: Mapping[str, str], name: str = "offset", default: int = 0) -> int:
    """A byte offset, or -1 for the write head."""
    text = param(query, name)
    if text == "-1":
        return -1
    return int_param(query, name, default, 0, MAX_INT64, "a byte offset (or -1: the "
                     "write head)", below=" (or -1: the write head)")


def time_param(query: Mapping[str, str], name: str = "since") -> int | None:
    """A time as gazctl takes one (Unix seconds, ISO 8601, ``1h ago``), None if absent."""
    text = param(query, name)
    if not text:
        return None
    try:
        value = parse_time(text)
    except ValueError as err:
        raise BadInput(str(err), field=name) from None
    if value < 0:
        raise BadInput(f"{short_repr(text)} is before 1970", field=name)
    return value


# -- showing ---------------------------------------------------------------------------


def when(seconds: float, now: float | None = None) -> str:
    """``2026-01-02 15:04:05 UTC (3 minutes ago)``; "" for 0 (never)."""
    if not seconds:
        return ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
    return f"{stamp} ({ago(seconds, now)})"


def labels_of(labels: LabelSet) -> list[tuple[str, str]]:
    return [(label.name, label.value) for label in labels]


@dataclass(frozen=True)
class RouteView:
    """A route as the pages show it: the primary and the other members, with zones."""

    primary: str
    replicas: list[str]

    @classmethod
    def of(cls, route: Route) -> RouteView:
        members = [f"{m.suffix} ({m.zone})" for m in route.members]
        primary = members[route.primary] if 0 <= route.primary < len(members) else ""
        return cls(primary, [m for i, m in enumerate(members) if i != route.primary])


def replica_text(status: ReplicaStatus) -> str:
    """A replica's state, with its recovery progress or its error."""
    text = status.state.name.lower()
    if status.error:
        return f"{text}: {' '.join(status.error.split())}"
    if status.to_play:
        share = 100 * status.played / status.to_play
        return (f"{text}: played {human_bytes(status.played)} of "
                f"{human_bytes(status.to_play)} ({share:.0f}%)")
    return text


def replicas_of(shard: ListedShard) -> list[dict[str, str]]:
    """Each replica of `shard`: its member, role and status."""
    out = []
    for i, member in enumerate(shard.route.members):
        status = shard.statuses[i] if i < len(shard.statuses) else None
        out.append({"member": f"{member.suffix} ({member.zone})",
                    "role": "primary" if i == shard.route.primary else "standby",
                    "status": replica_text(status) if status is not None else "unknown",
                    "state": status.state.name.lower() if status is not None else ""})
    return out


_CONTROL = {i: f"\\x{i:02x}" for i in (*range(0x20), 0x7F) if i not in (0x0A, 0x09)}
_CONTROL.update({0x0A: "\\n", 0x09: "\\t"})


def escaped(raw: bytes) -> str:
    """Bytes as text anyone can read: UTF-8 where it is, ``\\xNN`` for other bytes and
    for control characters (newlines too, so a line stays a line)."""
    return raw.decode("utf-8", "backslashreplace").translate(_CONTROL)


def pretty_json(raw: bytes) -> str | None:
    """`raw` pretty-printed if it is one JSON document, else None."""
    try:
        value = json.loads(raw)
    except ValueError:  # (UnicodeDecodeError too)
        return None
    return json.dumps(value, indent=2, ensure_ascii=False)


def pretty(value: Any) -> str:
    """A value (a spec's dict, hints) as indented JSON."""
    return json.dumps(value, indent=2, sort_keys=False, default=str, ensure_ascii=False)
