"""The CRDs are generated from the limits our validation enforces: committed files are
current, the examples pass both the schema and our validation, the schema refuses what
it can say is wrong, and its name pattern agrees with `gazette.names` exactly."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gazette import names
from gazette.errors import ValidationError
from gazette.protocol import JournalSpec, ShardSpec
from gazette_operator import crds

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "operator" / "examples"


def schema_of(crd: dict[str, Any]) -> jsonschema.Validator:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


JOURNALS = schema_of(crds.journal_crd())
SHARDS = schema_of(crds.shard_crd())


def errors(validator: jsonschema.Validator, resource: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(resource)]


def examples(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((EXAMPLES / name).read_text()))


@pytest.mark.parametrize("folder", crds.OUTPUTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crds_are_current(folder: Path) -> None:
    for name, text in crds.rendered().items():
        assert (folder / name).read_text() == text, \
            f"{folder / name} is stale: run python -m gazette_operator.crds"


def test_crds_are_namespaced_with_status_and_columns() -> None:
    for crd in (crds.journal_crd(), crds.shard_crd()):
        version = crd["spec"]["versions"][0]
        assert crd["spec"]["scope"] == "Namespaced" and version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}
        assert {"Primary", "Ready", "Age"} <= {c["name"] for c in
                                              version["additionalPrinterColumns"]}
        assert crd["spec"]["names"]["shortNames"]


def test_examples_pass_the_schema_and_our_validation() -> None:
    journals, shards = examples("journals.yaml"), examples("shards.yaml")
    assert {j["spec"]["name"] for j in journals} >= {
        "example/journal", "foobar/part-000", "foobar/part-001", "foobar/part-002"}
    for resource in journals:
        assert errors(JOURNALS, resource) == []
        JournalSpec.from_dict(resource["spec"])
    for resource in shards:
        assert errors(SHARDS, resource) == []
        spec = dict(resource["spec"])
        spec.pop("app")
        ShardSpec.from_dict(spec)


@pytest.mark.parametrize(("change", "field"), [
    ({"name": "x"}, "spec.name"),  # too short
    ({"name": "/abs/olute"}, "spec.name"),
    ({"name": "a//b"}, "spec.name"),
    ({"name": "a/../b"}, "spec.name"),
    ({"name": "a/b/"}, "spec.name"),
    ({"name": "bad name"}, "spec.name"),
    ({"replication": 0}, "spec.replication"),
    ({"replication": 2000}, "spec.replication"),
    ({"fragment": {"compression_codec": "LZ4"}}, "spec.fragment.compression_codec"),
    ({"fragment": {"stores": ["ftp://bucket/"]}}, "spec.fragment.stores.0"),
    ({"fragment": {"length": 10}}, "spec.fragment.length"),
    ({"fragment": {"refresh_interval": "soon"}}, "spec.fragment.refresh_interval"),
    ({"labels": [{"name": "-bad"}]}, "spec.labels.0.name"),
    ({"labels": [{"value": "no name"}]}, "spec.labels.0"),
])
def test_the_schema_refuses_bad_journals(change: dict[str, Any], field: str) -> None:
    resource = copy.deepcopy(examples("journals.yaml")[0])
    resource["spec"].update(change)
    found = errors(JOURNALS, resource)
    assert any(e.startswith(field + ":") for e in found), found
    with pytest.raises(ValidationError):  # and our validation refuses it too
        JournalSpec.from_dict(resource["spec"])


def test_what_a_schema_cannot_say_is_left_to_our_validation() -> None:
    # A bucket name with capitals passes the schema; the operator reports our error.
    resource = copy.deepcopy(examples("journals.yaml")[0])
    resource["spec"]["fragment"]["stores"] = ["s3://Not_A_Bucket/"]
    assert errors(JOURNALS, resource) == []
    with pytest.raises(ValidationError, match="bucket"):
        JournalSpec.from_dict(resource["spec"])


ALPHABET = "ab.-_+%/Z9 é#"


@given(st.text(ALPHABET, min_size=0, max_size=12))
def test_the_name_pattern_is_our_name_rule(name: str) -> None:
    import re

    by_schema = re.search(crds.path_pattern(), name) is not None and \
        names.MIN_JOURNAL_NAME_LEN <= len(name) <= names.MAX_JOURNAL_NAME_LEN
    try:
        names.validate_journal_name(name)
        ours = True
    except ValidationError:
        ours = False
    assert by_schema == ours, name


def test_help_prints_usage_and_writes_nothing() -> None:
    """``--help`` is answered by a parser; only the plain invocation writes the files."""
    import subprocess
    import sys

    files = [folder / name for folder in crds.OUTPUTS for name in crds.rendered()]
    before = {f: f.stat().st_mtime_ns for f in files}
    proc = subprocess.run([sys.executable, "-m", "gazette_operator.crds", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m gazette_operator.crds")
    assert "--check" in proc.stdout and "wrote" not in proc.stdout
    assert {f: f.stat().st_mtime_ns for f in files} == before
    check = subprocess.run([sys.executable, "-m", "gazette_operator.crds", "--check"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and check.stdout == "", check.stdout + check.stderr
    assert {f: f.stat().st_mtime_ns for f in files} == before
    bad = subprocess.run([sys.executable, "-m", "gazette_operator.crds", "--bogus"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr
