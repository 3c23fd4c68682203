"""Labels and selectors: how journals and shards are described and queried.

A `LabelSet` is the validated multi-map of labels on a spec; a `Selector` (parsed from
``prefix=foobar/, name notin (foobar/part-001)``) picks the label sets it matches. Journals
and shards also carry implicit labels (`journal_labels`, `shard_labels`) so selectors can
name them by name, id or prefix.
"""

from gazette.labels.labelset import (
    EMPTY,
    ID,
    NAME,
    PREFIX,
    RESERVED_JOURNAL_LABELS,
    RESERVED_SHARD_LABELS,
    Label,
    LabelSet,
    LabelsLike,
    journal_labels,
    shard_labels,
)
from gazette.labels.selector import Selector, parse_selector

__all__ = [
    "EMPTY",
    "ID",
    "NAME",
    "PREFIX",
    "RESERVED_JOURNAL_LABELS",
    "RESERVED_SHARD_LABELS",
    "Label",
    "LabelSet",
    "LabelsLike",
    "Selector",
    "journal_labels",
    "parse_selector",
    "shard_labels",
]
