"""`make images` (scripts/build_images.py) without building: the tags it would build are
the chart's scheme, and bad input is refused naming the setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "build_images.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", *args],
                          capture_output=True, text=True, timeout=30, check=False)


def test_the_tags_are_the_charts_scheme() -> None:
    proc = run()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"would build gazette-{t}:0.1.0 (target {t})"
                                        for t in ("broker", "operator", "consumer", "spark")]
    proc = run("--registry", "localhost:5000/team/", "--tag", "1.0-rc1", "--push", "spark")
    assert proc.stdout.strip() == ("would build localhost:5000/team/gazette-spark:1.0-rc1 "
                                   "(target spark), then push it")


def test_make_passes_its_variables() -> None:
    proc = subprocess.run(["make", "--no-print-directory", "images", "DRY_RUN=1",
                           "REGISTRY=ghcr.io/acme", "TAG=2.0", "IMAGES=operator",
                           f"PYTHON={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "would build ghcr.io/acme/gazette-operator:2.0 (target operator)" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--registry", "Bad Registry"], "REGISTRY='Bad Registry' is not a registry"),
    (["--registry", "ghcr.io//acme"], "is not a registry"),
    (["--tag=-rc"], "TAG='-rc' is not an image tag"),
    (["--tag", "a" * 129], "is not an image tag"),
    (["brokr"], "unknown target brokr: choose from broker, operator, consumer, spark"),
    (["--pip-cert", "/nonexistent/ca.pem"], "--pip-cert /nonexistent/ca.pem: no such file"),
])
def test_bad_input_is_refused_naming_it(args: list[str], message: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
