"""Where gazctl's settings come from, and the parsing of flag values.

The broker address is ``--broker``, else ``$BROKER_ADDRESS``, else ``Address`` under
``[journals.Broker]`` in ``$HOME/.config/gazette/gazctl.ini`` (the tutorial's file; a
``[journals]`` or ``[Broker]`` section is read too), else ``localhost:8080``.
An ``https://`` address is reached over TLS (`gazette.auth.auth_for`).
The consumer member's (``gazctl shards``) is ``--consumer.address``, else
``$CONSUMER_ADDRESS``, else ``Address`` under ``[shards.Consumer]`` (or ``[shards]``,
``[Consumer]``), else ``localhost:8090``.
"""

from __future__ import annotations

import argparse
import configparser
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from gazette import names
from gazette.client import parse_address
from gazette.client.connection import MAX_INT64  # offsets, times and sizes are int64
from gazette.errors import GazetteError, ValidationError, short_repr
from gazette.labels import Selector
from gazette.protocol.durations import parse_duration

DEFAULT_ADDRESS = "localhost:8080"
#: etcd's default --max-txn-ops: the most changes one Apply may carry.
MAX_TXN_SIZE = 128
#: Sections of gazctl.ini holding ``Address``, first match wins.
INI_SECTIONS = ("journals.Broker", "journals.broker", "journals", "Broker", "broker")
DEFAULT_CONSUMER_ADDRESS = "localhost:8090"
CONSUMER_INI_SECTIONS = ("shards.Consumer", "shards.consumer", "shards", "Consumer",
                         "consumer")


class UsageError(GazetteError):
    """A bad flag or flag value: gazctl exits 2."""


def ini_path(env: Mapping[str, str] | None = None) -> Path:
    """``$HOME/.config/gazette/gazctl.ini``."""
    env = os.environ if env is None else env
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".config" / "gazette" / "gazctl.ini"


def read_ini(path: Path) -> configparser.ConfigParser | None:
    """The parsed file, None if there is none; UsageError naming the file if it is not
    INI."""
    if not path.is_file():
        return None
    config = configparser.ConfigParser(interpolation=None)
    try:
        config.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise UsageError(f"{path}: not a valid INI file: {reason}") from None
    return config


@dataclass(frozen=True)
class Address:
    """A server's address and where it came from (for error messages)."""

    address: str
    source: str


def _address(what: str, flag: tuple[str, str | None], variable: str,
             sections: tuple[str, ...], default: str, env: Mapping[str, str] | None
             ) -> Address:
    """The `flag` (its name and value), then `$variable`, then gazctl.ini's `sections`,
    then `default`; UsageError if the chosen address is not one (naming `what` and
    where it came from)."""
    env = os.environ if env is None else env
    found: Address | None = None
    if flag[1]:
        found = Address(flag[1], flag[0])
    elif env.get(variable):
        found = Address(env[variable], f"${variable}")
    else:
        path = ini_path(env)
        config = read_ini(path)
        if config is not None:
            for section in sections:
                value = config.get(section, "Address", fallback="").strip()
                if value:
                    found = Address(value, f"{path} [{section}] Address")
                    break
    found = found or Address(default, "the default")
    try:
        parse_address(found.address)
    except ValidationError as err:
        raise UsageError(f"{what} address from {found.source}: {err.reason}") from None
    return found


def broker_address(flag: str | None, env: Mapping[str, str] | None = None) -> Address:
    """--broker, then $BROKER_ADDRESS, then gazctl.ini, then the default."""
    return _address("broker", ("--broker", flag), "BROKER_ADDRESS", INI_SECTIONS,
                    DEFAULT_ADDRESS, env)


def consumer_address(flag: str | None, env: Mapping[str, str] | None = None) -> Address:
    """--consumer.address, then $CONSUMER_ADDRESS, then gazctl.ini, then the default."""
    return _address("consumer", ("--consumer.address", flag), "CONSUMER_ADDRESS",
                    CONSUMER_INI_SECTIONS, DEFAULT_CONSUMER_ADDRESS, env)


# -- flag value types (argparse `type=`: errors become exit 2 with the flag's name) ----


def selector_arg(text: str) -> Selector:
    """A label selector (``prefix=foobar/, name not in (foobar/part-001)``)."""
    try:
        return Selector.parse(text) if text.strip() else Selector()
    except ValidationError as err:
        raise argparse.ArgumentTypeError(f"bad selector: {err.reason}") from None


def shard_arg(text: str) -> str:
    """A shard ID."""
    try:
        names.validate_shard_id(text, "shard")
    except ValidationError as err:
        raise argparse.ArgumentTypeError(f"bad shard ID {text!r}: {err.reason}") from None
    return text


def journal_arg(text: str) -> str:
    """A journal name."""
    try:
        names.validate_journal_name(text, "journal")
    except ValidationError as err:
        raise argparse.ArgumentTypeError(f"bad journal name {text!r}: {err.reason}") from None
    return text


def duration_arg(text: str) -> timedelta:
    """A duration such as ``24h``, ``1m30s``."""
    try:
        return parse_duration(text, "duration")
    except ValidationError as err:
        raise argparse.ArgumentTypeError(err.reason) from None


_INT = re.compile(r"[+-]?[0-9]+")


def bounded_int(text: str, what: str, lo: int, hi: int, *, below: str = "",
                above: str = "") -> int:
    """An integer in ``lo..hi`` (ASCII digits only); ArgumentTypeError saying which bound
    it broke (`below`/`above`: why that bound), with the value as given. Checked here
    because protobuf would fail deep inside with a traceback on anything past int64."""
    s = text.strip()
    if not _INT.fullmatch(s):
        raise argparse.ArgumentTypeError(f"expected {what}, got {short_repr(text)}")
    digits = s.lstrip("+-")
    # int() refuses more than 4300 digits, and such a number is no use in a message.
    shown = s if len(digits) <= 40 else f"a {len(digits)}-digit number"
    value = int(s) if len(digits) <= 40 else (-1 if s.startswith("-") else 1) * 10**40
    if value < lo:
        raise argparse.ArgumentTypeError(f"must be at least {lo}{below}, got {shown}")
    if value > hi:
        raise argparse.ArgumentTypeError(f"must be at most {hi}{above}, got {shown}")
    return value


def offset_arg(text: str) -> int:
    """A byte offset, 0 to 2^63-1."""
    return bounded_int(text, "a byte offset", 0, MAX_INT64,
                       below=" (use --tail to start at the write head)")


def txn_size_arg(text: str) -> int:
    """How many changes one Apply may carry: 1 to etcd's limit."""
    return bounded_int(text, "a number of changes", 1, MAX_TXN_SIZE,
                       above=" (etcd's limit of operations in one transaction)")


def size_arg(text: str) -> int:
    """A size in bytes, at least 1."""
    return bounded_int(text, "a number of bytes", 1, MAX_INT64)


_AGO = re.compile(r"^(.+?)\s*ago$")


def parse_time(text: str, now: float | None = None) -> int:
    """Unix seconds from ``1700000000``, an ISO 8601 time (``2026-01-02T15:04:05``,
    local time unless it has an offset or ``Z``), or a duration ago (``1h``, ``90m ago``).
    """
    s = text.strip()
    if re.fullmatch(r"[0-9]+", s):
        return int(s)
    now = time.time() if now is None else now
    m = _AGO.match(s)
    try:
        return int(now - parse_duration(m.group(1) if m else s, "time").total_seconds())
    except ValidationError as err:
        if "longer than" in err.reason:  # a duration, but too long: say so
            raise ValueError(err.reason) from None
    try:
        when = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith("Z") else s)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use Unix seconds, an ISO 8601 time "
                         "(2026-01-02T15:04:05Z) or a duration ago (1h)") from None
    return int(when.timestamp())


def time_arg(text: str) -> int:
    """A time (see `parse_time`) as Unix seconds, 1970 to 2^63-1."""
    if re.fullmatch(r"[0-9]+", text.strip()):
        return bounded_int(text, "a time", 0, MAX_INT64, above=" (Unix seconds)")
    try:
        value = parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is before 1970-01-01T00:00:00Z")
    return value
