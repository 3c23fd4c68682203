"""The docs stay true: every ```python example in README.md and docs/ runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
