"""Log flags (``--log.level``, ``--log.format``, with environment fallbacks) and the
process's log handler, shared by ``gazette serve`` and ``gazette dev up``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log.level", dest="log_level",
                        default=os.environ.get("LOG_LEVEL", "info"),
                        choices=["debug", "info", "warn", "warning", "error"],
                        help="log level [$LOG_LEVEL] (default: info)")
    parser.add_argument("--log.format", dest="log_format",
                        default=os.environ.get("LOG_FORMAT", "text"), choices=["text", "json"],
                        help="log format [$LOG_FORMAT] (default: text)")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)-5s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if level.startswith("warn") else level.upper())
