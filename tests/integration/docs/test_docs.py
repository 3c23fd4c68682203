"""The docs stay true: every ```python example in README.md and docs/ runs as written, and
what they say of the commands matches the commands (gazctl's verbs, dev up's brokers)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, str]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, code in enumerate(BLOCK.findall(doc.read_text())):
            found.append((f"{doc.relative_to(ROOT)}#{i}", code))
    return found


def test_docs_have_examples() -> None:
    assert len(examples()) >= 3


@pytest.mark.integration
@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_doc_example_runs(where: str, code: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def test_gazctl_md_documents_every_verb_and_denies_none() -> None:
    from gazette.gazctl.__main__ import build_parser

    text = (ROOT / "docs" / "gazctl.md").read_text()
    for noun, parser in subcommands(build_parser()).items():
        assert not re.search(rf"\b[Nn]o\b[^.]*`{noun}` commands", text), \
            f"docs/gazctl.md says gazctl has no {noun} commands"
        for verb in subcommands(parser):
            assert f"gazctl {noun} {verb}" in text, f"gazctl {noun} {verb} is undocumented"


def test_broker_md_says_how_many_brokers_dev_up_starts() -> None:
    from gazette_broker.cli import build_parser
    from gazette_dev.up import add_dev_parser

    up = subcommands(subcommands(build_parser(add_dev_parser))["dev"])["up"]
    count = next(a.default for a in up._actions if a.dest == "brokers")
    word = {1: "one broker", 2: "two brokers", 3: "three brokers"}[count]
    text = (ROOT / "docs" / "broker.md").read_text()
    said = re.findall(r"(?:etcd \+|and) (\w+ brokers?)\b[^.]*?(?:on embedded defaults|in two "
                      r"zones)", text)
    assert said and set(said) == {word}, said
