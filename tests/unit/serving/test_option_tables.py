"""The docs' tables of the processes' flags are the ones their options make
(``scripts/gen_option_tables.py``), and those options are the commands' flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_option_tables  # noqa: E402  (scripts/ is not a package)

from gazette.serving.options import Option  # noqa: E402
from gazette_broker.cli import build_parser as broker_parser  # noqa: E402
from gazette_consumer.cli import build_parser as consumer_parser  # noqa: E402


@pytest.mark.parametrize("doc", gen_option_tables.DOCS, ids=lambda d: d.name)
def test_the_docs_tables_are_the_generated_ones(doc: Path) -> None:
    text = doc.read_text()
    assert gen_option_tables.tables_in(text), f"{doc.name} has no marked table"
    assert text == gen_option_tables.regenerated(text), \
        f"{doc.name}: run `python scripts/gen_option_tables.py`"


def test_every_table_is_in_the_docs() -> None:
    found = [name for doc in gen_option_tables.DOCS
             for name in gen_option_tables.tables_in(doc.read_text())]
    assert sorted(found) == sorted(gen_option_tables.TABLES)


def serve_flags(parser: argparse.ArgumentParser) -> set[str]:
    serve = next(action.choices["serve"] for action in parser._actions
                 if isinstance(action, argparse._SubParsersAction))
    return {flag for action in serve._actions for flag in action.option_strings
            if flag not in ("-h", "--help")}


@pytest.mark.parametrize(("command", "parser"), [
    ("gazette serve", broker_parser), ("gazette-consumer serve", consumer_parser)])
def test_the_tables_and_the_security_table_cover_every_flag(
        command: str, parser: type[argparse.ArgumentParser]) -> None:
    listed: list[Option] = [*gen_option_tables.TABLES[command],
                            *gen_option_tables.TABLES["security"]]
    assert {option.flag for option in listed} == serve_flags(parser())
