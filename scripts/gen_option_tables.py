"""Regenerate the docs' tables of the processes' flags from their options
(`gazette.serving.options.Option`), so the docs say what ``--help`` says.

Each table sits between ``<!-- options: NAME -->`` and ``<!-- end options -->`` in a doc;
`TABLES` says which options each NAME lists. ``python scripts/gen_option_tables.py``
rewrites the tables in place; tests/unit/serving/test_option_tables.py checks they are current.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from gazette.console.config import CONSOLE_OPTIONS
from gazette.serving.options import LOG_OPTIONS, SECURITY_OPTIONS, Option, markdown_table
from gazette_broker.cli import SERVE_OPTIONS as BROKER_OPTIONS
from gazette_consumer.cli import APP_OPTION
from gazette_consumer.cli import SERVE_OPTIONS as CONSUMER_OPTIONS

ROOT = Path(__file__).resolve().parents[1]


def _without_security(options: Sequence[Option]) -> list[Option]:
    """A process's own options (the security ones have their table in security.md)."""
    security = {option.flag for option in SECURITY_OPTIONS}
    return [option for option in options if option.flag not in security]


#: The options each table lists, by its name in the docs' markers.
TABLES: dict[str, list[Option]] = {
    "gazette serve": [*_without_security(BROKER_OPTIONS), *LOG_OPTIONS],
    "gazette-consumer serve": [APP_OPTION, *_without_security(CONSUMER_OPTIONS),
                               *LOG_OPTIONS],
    "security": list(SECURITY_OPTIONS),
    "gazette console": [*CONSOLE_OPTIONS, *LOG_OPTIONS],
}

#: The docs that hold tables.
DOCS = [ROOT / "docs" / name for name in ("broker.md", "consumers.md", "security.md",
                                                 "console.md")]

MARKED = re.compile(r"(<!-- options: (?P<name>[^>]+?) -->\n)(?P<table>.*?)(<!-- end options -->)",
                    re.DOTALL)


def regenerated(text: str) -> str:
    """`text` with every marked table made again from its options."""
    return MARKED.sub(lambda m: m.group(1) + markdown_table(TABLES[m.group("name")])
                      + m.group(4), text)


def tables_in(text: str) -> list[str]:
    """The names of the marked tables in `text`."""
    return [m.group("name") for m in MARKED.finditer(text)]


def main() -> int:
    for doc in DOCS:
        text = doc.read_text()
        new = regenerated(text)
        if new != text:
            doc.write_text(new)
            print(f"rewrote the tables of {doc.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
