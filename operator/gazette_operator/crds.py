"""The `JournalSpec` and `ShardSpec` custom resource definitions, generated from the
limits `gazette.protocol` and `gazette.names` enforce, so the Kubernetes API server
refuses what our validation would refuse wherever a schema can say it (ranges, lengths,
characters, enums), and the rules are written once.

What a schema cannot say (a store URL's bucket and query, a label that must have one
value, flag combinations) the operator checks with the same validation code, and
reports as a ``Ready=False`` condition naming the field.

``python -m gazette_operator.crds`` writes the CRDs into ``operator/crds/`` and the
chart's ``crds/`` (``--check`` only says which are stale; ``--help``); a test fails when
the committed files are stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gazette import names
from gazette.protocol import INT64_MAX, MAX_DURATION
from gazette.protocol import journal_spec as js
from gazette.protocol import shard_spec as ss

GROUP = "gazette-py.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

Schema = dict[str, Any]


def _chars(symbols: str) -> str:
    return "A-Za-z0-9" + re.escape(symbols).replace("/", "")


def path_pattern(symbols: str = names.PATH_SYMBOLS) -> str:
    """A relative path of `symbols`: no leading, trailing or doubled '/', no '.' or '..'
    component (a component holds a character that is not '.', or is three dots or more)
    (RE2: no look-arounds)."""
    chars = _chars(symbols.replace("/", ""))
    not_dot = _chars(symbols.replace("/", "").replace(".", ""))
    segment = f"(?:[{chars}]*[{not_dot}][{chars}]*|\\.{{3,}})"
    return f"^{segment}(?:/{segment})*$"


def _string(pattern: str, min_len: int, max_len: int, description: str) -> Schema:
    return {"type": "string", "pattern": pattern, "minLength": min_len,
            "maxLength": max_len, "description": description}


def _integer(lo: int, hi: int, description: str, default: int | None = None) -> Schema:
    out: Schema = {"type": "integer", "format": "int64", "minimum": lo, "maximum": hi,
                   "description": description}
    if default is not None:
        out["default"] = default
    return out


#: A duration: Go-style text (``1m30s``) or a number of seconds.
DURATION: Schema = {
    "x-kubernetes-int-or-string": True,
    "pattern": r"^[+]?(?:0|(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:h|ms|us|µs|m|s))+)$",
    "description": f"a duration such as '1m30s' or '500ms', or whole seconds; at most "
                   f"{MAX_DURATION.days // 365} years",
}


def _duration(description: str) -> Schema:
    return {**DURATION, "description": f"{description} ({DURATION['description']})"}


def _enum(values: list[str], description: str) -> Schema:
    """Values as our parsers take them: any case."""
    both = sorted({*values, *(v.lower() for v in values)})
    return {"type": "string", "enum": both, "description": description}


LABELS: Schema = {
    "type": "array",
    "description": "labels of the spec (a name may repeat with other values)",
    "items": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": _string(
                f"^[A-Za-z0-9](?:[{_chars(names.LABEL_NAME_SYMBOLS)}/]*[A-Za-z0-9])?$",
                names.MIN_LABEL_NAME_LEN, names.MAX_LABEL_NAME_LEN, "label name"),
            "value": _string(f"^[{_chars(names.LABEL_VALUE_SYMBOLS)}/]*$", 0,
                             names.MAX_LABEL_VALUE_LEN, "label value (may be empty)"),
        },
    },
}


def journal_spec_schema() -> Schema:
    """The ``spec`` of a JournalSpec resource: the YAML form of `JournalSpec`."""
    stores = {"type": "string", "pattern": "^(" + "|".join(js.STORE_SCHEMES) + ")://",
              "maxLength": 2048,
              "description": "a fragment store: file:///path/ or s3://bucket/prefix/?..."}
    return {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": _string(path_pattern(), names.MIN_JOURNAL_NAME_LEN,
                            names.MAX_JOURNAL_NAME_LEN,
                            "the journal's name, such as example/journal"),
            "replication": _integer(1, js.MAX_REPLICATION, "brokers holding each append",
                                    js.DEFAULT_REPLICATION),
            "labels": LABELS,
            "fragment": {
                "type": "object",
                "description": "how the journal is cut into fragments, and where they go",
                "properties": {
                    "length": _integer(js.MIN_FRAGMENT_LENGTH, js.MAX_FRAGMENT_LENGTH,
                                       "bytes at which a fragment is closed"),
                    "compression_codec": _enum([c.value for c in js.CompressionCodec],
                                               "how fragments are compressed in stores"),
                    "stores": {"type": "array", "maxItems": js.MAX_STORES, "items": stores,
                               "description": "stores, the first receiving new fragments"},
                    "refresh_interval": _duration("how often stores are listed"),
                    "retention": _duration("how long fragments are kept (0: forever)"),
                    "flush_interval": _duration("a fragment is closed at least this often"),
                    "path_postfix_template": {
                        "type": "string", "maxLength": 256,
                        "description": "Hive-style folders such as date={date}/hour={hour}"},
                },
            },
            "flags": {"x-kubernetes-int-or-string": True,
                      "description": "O_RDONLY, O_WRONLY or O_RDWR (or a bitmask)"},
            "max_append_rate": _integer(0, INT64_MAX, "bytes per second (0: no limit)"),
            "suspend": {
                "type": "object",
                "properties": {
                    "level": _enum([lv.value for lv in js.SuspendLevel], "suspension level"),
                    "offset": _integer(0, INT64_MAX, "offset it was suspended at"),
                },
            },
        },
    }


def shard_spec_schema() -> Schema:
    """The ``spec`` of a ShardSpec resource: the YAML form of `ShardSpec`, plus the
    consumer application it belongs to (which selects its etcd prefix)."""
    journal = _string(path_pattern(), names.MIN_JOURNAL_NAME_LEN, names.MAX_JOURNAL_NAME_LEN,
                      "a source journal")
    return {
        "type": "object",
        "required": ["app", "id"],
        "properties": {
            "app": _string(path_pattern(), 1, 128,
                           "the consumer application (its shards live under its etcd "
                           "prefix)"),
            "id": _string(path_pattern(), names.MIN_SHARD_ID_LEN, names.MAX_SHARD_ID_LEN,
                          "the shard's id, such as word-count/part-000"),
            "sources": {
                "type": "array", "maxItems": ss.MAX_SOURCES,
                "items": {"type": "object", "required": ["journal"], "properties": {
                    "journal": journal,
                    "min_offset": _integer(0, INT64_MAX, "offset to begin reading at"),
                }},
            },
            "recovery_log_prefix": {"type": "string", "maxLength": names.MAX_JOURNAL_NAME_LEN},
            "hint_prefix": {"type": "string", "maxLength": 512},
            "hint_backups": _integer(0, ss.MAX_HINT_BACKUPS, "older hints kept"),
            "max_txn_duration": _duration("longest consumer transaction"),
            "min_txn_duration": _duration("shortest consumer transaction"),
            "disable": {"type": "boolean"},
            "hot_standbys": _integer(0, ss.MAX_HOT_STANDBYS, "standby replicas"),
            "labels": LABELS,
            "disable_wait_for_ack": {"type": "boolean"},
            "ring_buffer_size": _integer(1, INT64_MAX, "messages buffered",
                                         ss.DEFAULT_RING_BUFFER_SIZE),
            "read_channel_size": _integer(1, INT64_MAX, "reads buffered",
                                          ss.DEFAULT_READ_CHANNEL_SIZE),
        },
    }


STATUS: Schema = {
    "type": "object",
    "description": "what the operator observed (written by it only)",
    "properties": {
        "observedGeneration": {"type": "integer", "format": "int64"},
        "etcdKey": {"type": "string"},
        "modRevision": {"type": "integer", "format": "int64",
                        "description": "etcd mod revision of the spec the operator wrote"},
        "primary": {"type": "string",
                    "description": "primary broker (journals) or consumer member (shards)"},
        "replicas": {"type": "array", "items": {"type": "string"}},
        "state": {"type": "string",
                  "description": "a shard's state: pending, recovering, standby, primary, "
                                 "or failed: <error>"},
        "ready": {"type": "string"},
        "owner": {"type": "string",
                  "description": "namespace/name of the resource owning the spec in etcd: "
                                 "this one, or the one it conflicts with"},
        "conditions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "observedGeneration": {"type": "integer", "format": "int64"},
                },
            },
        },
    },
}


def crd(kind: str, plural: str, short_names: list[str], spec: Schema,
        columns: list[tuple[str, str, str]]) -> Schema:
    """A namespaced CRD of `kind` with a status subresource and printer columns
    (name, type, JSONPath)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                      "listKind": f"{kind}List", "shortNames": short_names,
                      "categories": ["gazette"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    *({"name": n, "type": t, "jsonPath": p} for n, t, p in columns),
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec,
                        "status": STATUS,
                    },
                }},
            }],
        },
    }


def journal_crd() -> Schema:
    return crd("JournalSpec", "journalspecs", ["js", "journal"], journal_spec_schema(), [
        ("Journal", "string", ".spec.name"),
        ("Replication", "integer", ".spec.replication"),
        ("Primary", "string", ".status.primary"),
        ("Ready", "string", ".status.ready"),
    ])


def shard_crd() -> Schema:
    return crd("ShardSpec", "shardspecs", ["ss", "shard"], shard_spec_schema(), [
        ("App", "string", ".spec.app"),
        ("Shard", "string", ".spec.id"),
        ("State", "string", ".status.state"),
        ("Primary", "string", ".status.primary"),
        ("Ready", "string", ".status.ready"),
    ])


def peering_crds() -> list[Schema]:
    """kopf's peering resources (group ``kopf.dev``): the operator's replicas find each
    other there and one acts. ``ClusterKopfPeering`` serves an operator watching every
    namespace, ``KopfPeering`` one watching listed namespaces."""
    def peering(kind: str, scope: str) -> Schema:
        plural = f"{kind.lower()}s"
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kopf.dev"},
            "spec": {
                "group": "kopf.dev", "scope": scope,
                "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                "versions": [{
                    "name": "v1", "served": True, "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "status": {"type": "object",
                                   "x-kubernetes-preserve-unknown-fields": True}}}},
                }],
            },
        }
    return [peering("ClusterKopfPeering", "Cluster"), peering("KopfPeering", "Namespaced")]


HEADER = ("# Generated by `python -m gazette_operator.crds` from the limits of "
          "gazette.protocol;\n# do not edit: change the code and run it again.\n")


def render(resource: Schema) -> str:
    return HEADER + yaml.safe_dump(resource, sort_keys=False, allow_unicode=True, width=100)


ROOT = Path(__file__).resolve().parents[2]
#: Where the rendered CRDs are committed: the operator's folder and the chart's.
OUTPUTS = [ROOT / "operator" / "crds", ROOT / "charts" / "gazette" / "crds"]


def rendered() -> dict[str, str]:
    """File name -> content of every CRD."""
    return {"journalspecs.yaml": render(journal_crd()), "shardspecs.yaml": render(shard_crd()),
            "kopfpeerings.yaml": HEADER + yaml.safe_dump_all(
                peering_crds(), sort_keys=False, width=100)}


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="python -m gazette_operator.crds",
        description="Write the JournalSpec, ShardSpec and kopf peering CRDs, generated "
                    "from gazette.protocol's limits, into " +
                    " and ".join(str(f.relative_to(ROOT)) for f in OUTPUTS) + ".")


def stale() -> list[Path]:
    """The committed CRD files that differ from what the code generates."""
    return [folder / name for folder in OUTPUTS for name, text in rendered().items()
            if not (folder / name).is_file() or (folder / name).read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming the files that are stale")
    args = p.parse_args(argv)
    if args.check:
        for path in stale():
            print(f"{path.relative_to(ROOT)} is stale: run python -m gazette_operator.crds")
        return 1 if stale() else 0
    for folder in OUTPUTS:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in rendered().items():
            (folder / name).write_text(text)
            print(f"wrote {(folder / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
