"""The alert rules (charts/gazette/files/alerts.yaml), checked by Prometheus' own promtool:
the file is valid, and its unit tests (files/alerts_test.yaml) pass; those tests fire
every alert and show each quiet on healthy series (or before its `for`). Each alert
follows the conventions and links a runbook that docs/operations.md has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.promql import alert_rules, promtool

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "charts" / "gazette" / "files"
ALERTS = FILES / "alerts.yaml"
TESTS = FILES / "alerts_test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOKS = "https://github.com/gazette-py/gazette-py/blob/main/docs/operations.md#"


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60,
                          cwd=FILES, check=False)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    proc = run_promtool("check", "rules", ALERTS.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = run_promtool("test", "rules", TESTS.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_fires_in_a_test_and_stays_quiet_in_one() -> None:
    cases = [check for test in yaml.safe_load(TESTS.read_text())["tests"]
             for check in test.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = {name for name, _ in alert_rules(ALERTS)}
    assert not names - fired, f"alerts no test fires: {sorted(names - fired)}"
    assert not names - quiet, f"alerts no test shows quiet: {sorted(names - quiet)}"
    assert not (fired | quiet) - names, "tests of alerts alerts.yaml does not have"


def test_alerts_follow_the_conventions() -> None:
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)) >= 13
    for rule in rules():
        name = rule["alert"]
        assert re.fullmatch(r"Gazette(?:[A-Z][a-z0-9]*|TLS)+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name
        assert rule["annotations"]["runbook_url"] == RUNBOOKS + name.lower(), name


def github_anchor(heading: str) -> str:
    """The anchor GitHub makes of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook() -> None:
    text = OPERATIONS.read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#{2,4} (.+)$", text, re.MULTILINE)}
    sections = re.split(r"^### ", text, flags=re.MULTILINE)
    for rule in rules():
        name = rule["alert"]
        assert name.lower() in anchors, f"docs/operations.md has no heading {name}"
        [section] = [s for s in sections if s.startswith(name + "\n")]
        for part in ("**Means.**", "**Confirm.**", "**Do.**"):
            assert part in section, f"the runbook of {name} lacks {part}"
