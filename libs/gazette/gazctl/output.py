"""What gazctl prints: boxed tables as the tutorial shows them, humanized sizes and ages,
log lines in the tutorial's ``INFO[0000] message key=value`` form (or JSON), and a
progress bar on a terminal's stderr."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

#: A cell that is a number is right-aligned, as Go's tablewriter does.
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A boxed table: headers upper-cased and centred, numbers right-aligned.

    >>> print(table(["name"], [["example/journal"]]))
    +-----------------+
    |      NAME       |
    +-----------------+
    | example/journal |
    +-----------------+
    """
    heads = [h.upper() for h in headers]
    for i, row in enumerate(rows):
        if len(row) != len(heads):
            raise ValueError(f"row {i} has {len(row)} cells, expected {len(heads)}")
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(heads)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def centred(text: str, width: int) -> str:
        gap = width - len(text)
        return " " * (gap // 2) + text + " " * (gap - gap // 2)

    def cell(text: str, width: int) -> str:
        return text.rjust(width) if _NUMBER.match(text) else text.ljust(width)

    def line(cells: Sequence[str], header: bool = False) -> str:
        return "|" + "|".join(f" {centred(c, w) if header else cell(c, w)} "
                              for c, w in zip(cells, widths, strict=True)) + "|"

    return "\n".join([rule, line(heads, True), rule, *(line(r) for r in rows), rule])


_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: int) -> str:
    """Bytes in IEC units as the tutorial prints them: ``43 B``, ``2.3 KiB``, ``12 MiB``."""
    if n < 10:
        return f"{n} B"
    exp = 0
    while exp + 1 < len(_IEC) and n >= 1024 ** (exp + 1):
        exp += 1
    val = math.floor(n / 1024 ** exp * 10 + 0.5) / 10
    return f"{val:.1f} {_IEC[exp]}" if val < 10 else f"{val:.0f} {_IEC[exp]}"


_AGES = (  # (below this many seconds, unit seconds, singular text, plural unit)
    (2, 1, "1 second", "seconds"),
    (60, 1, "", "seconds"),
    (120, 60, "1 minute", "minutes"),
    (3600, 60, "", "minutes"),
    (7200, 3600, "1 hour", "hours"),
    (86400, 3600, "", "hours"),
    (2 * 86400, 86400, "1 day", "days"),
    (7 * 86400, 86400, "", "days"),
    (14 * 86400, 7 * 86400, "1 week", "weeks"),
    (30 * 86400, 7 * 86400, "", "weeks"),
    (60 * 86400, 30 * 86400, "1 month", "months"),
    (365 * 86400, 30 * 86400, "", "months"),
    (730 * 86400, 365 * 86400, "1 year", "years"),
)


def ago(mod_time: float, now: float | None = None) -> str:
    """How long ago Unix time `mod_time` was, humanized (``8 minutes ago``); "" for 0
    (a fragment that is not persisted)."""
    if not mod_time:
        return ""
    delta = (time.time() if now is None else now) - mod_time
    suffix = "ago"
    if delta < 0:
        delta, suffix = -delta, "from now"
    if delta < 1:
        return "now"
    for below, unit, single, plural in _AGES:
        if delta < below:
            return f"{single or f'{int(delta // unit)} {plural}'} {suffix}"
    return f"{int(delta // (365 * 86400))} years {suffix}"


# -- logging ---------------------------------------------------------------------------

_LEVELS = {"DEBUG": "DEBU", "INFO": "INFO", "WARNING": "WARN", "ERROR": "ERRO",
           "CRITICAL": "FATA"}
_JSON_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error",
                "CRITICAL": "fatal"}
_BARE = re.compile(r"^[A-Za-z0-9_./:@+\-]*$")


def log_fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, Mapping) else {}


def _text_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value) \
        if isinstance(value, bool | None) else str(value)
    return text if _BARE.match(text) else json.dumps(text)


class TextFormatter(logging.Formatter):
    """``INFO[0003] read started journal=example/journal offset=0``: the level, seconds
    since gazctl started, the message and its fields (``extra={"fields": {...}}``)."""

    def __init__(self, started: float | None = None) -> None:
        super().__init__()
        self.started = time.time() if started is None else started

    def format(self, record: logging.LogRecord) -> str:
        level = _LEVELS.get(record.levelname, record.levelname[:4])
        elapsed = max(0, int(record.created - self.started))
        parts = [f"{level}[{elapsed:04d}] {record.getMessage()}"]
        parts += [f"{k}={_text_value(v)}" for k, v in log_fields(record).items()]
        if record.exc_info:
            parts.append("error=" + json.dumps(str(record.exc_info[1])))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: level, msg, time, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "level": _JSON_LEVELS.get(record.levelname, record.levelname.lower()),
            "msg": record.getMessage(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
        }
        for key, value in log_fields(record).items():
            out[key] = value if isinstance(value, str | int | float | bool | None) \
                else str(value)
        if record.exc_info:
            out["error"] = str(record.exc_info[1])
        return json.dumps(out)


LOG_LEVELS = ("debug", "info", "warn", "warning", "error")


def setup_logging(level: str, fmt: str, stream: TextIO | None = None) -> logging.Handler:
    """Send every log record at `level` or above to stderr in `fmt` (text or json)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if level.startswith("warn") else level.upper())
    return handler


# -- progress --------------------------------------------------------------------------


class Progress:
    """A one-line progress bar (``[#####.....] 3/10 journals  example/journal``) on a
    terminal's stderr; does nothing when stderr is not a terminal."""

    WIDTH = 30

    def __init__(self, total: int, unit: str, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.total, self.unit, self.done = total, unit, 0
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self._last = ""

    def render(self, note: str = "") -> str:
        filled = self.WIDTH * self.done // self.total if self.total else self.WIDTH
        bar = "#" * filled + "." * (self.WIDTH - filled)
        return f"[{bar}] {self.done}/{self.total} {self.unit}" + (f"  {note}" if note else "")

    def update(self, done: int | None = None, note: str = "") -> None:
        if done is not None:
            self.done = done
        if not self.enabled:
            return
        text = self.render(note)
        pad = " " * max(0, len(self._last) - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._last = text

    def step(self, note: str = "") -> None:
        """One more done (`note`: what it was)."""
        self.update(self.done + 1, note)

    def clear(self) -> None:
        """Erase the bar (before printing other lines, and when done)."""
        if self.enabled and self._last:
            self.stream.write("\r" + " " * len(self._last) + "\r")
            self.stream.flush()
            self._last = ""
