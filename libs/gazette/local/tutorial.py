"""The specs and selectors of the broker tutorial, shared by the demo, docs and tests."""

from __future__ import annotations

#: ``example/journal`` as the tutorial's first ``gazctl journals apply`` writes it.
EXAMPLE_JOURNAL_YAML = """\
name: example/journal
replication: 1
labels:
- name: app.gazette.dev/message-type
  value: TestMessage
- name: app.gazette.dev/region
  value: local
- name: app.gazette.dev/tag
  value: demo
- name: content-type
  value: application/x-ndjson
fragment:
  length: 131072
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1m0s
"""

#: The tutorial's spec tree: a ``foobar/`` group whose three children inherit its fields.
FOOBAR_TREE_YAML = """\
name: foobar/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
- name: my-label
fragment:
  length: 4096
  compression_codec: GZIP
  stores:
  - file:///
  refresh_interval: 1m0s
  flush_interval: 1m0s
children:
  - name: foobar/part-000
  - name: foobar/part-001
  - name: foobar/part-002
"""

#: Both, as one multi-document YAML stream.
TUTORIAL_JOURNALS_YAML = f"{EXAMPLE_JOURNAL_YAML}---\n{FOOBAR_TREE_YAML}"

#: The selectors the tutorial lists journals with, and the journals each selects.
TUTORIAL_SELECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prefix=example/", ("example/journal",)),
    ("prefix=foobar/", ("foobar/part-000", "foobar/part-001", "foobar/part-002")),
    ("app.gazette.dev/message-type=TestMessage", ("example/journal",)),
    ("my-label", ("foobar/part-000", "foobar/part-001", "foobar/part-002")),
    ("name in (example/journal, foobar/part-001)", ("example/journal", "foobar/part-001")),
    ("prefix=foobar/, name not in (foobar/part-001)", ("foobar/part-000", "foobar/part-002")),
)
