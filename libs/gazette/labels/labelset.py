"""LabelSet: the immutable multi-map of labels that describes a journal or shard.

Gazette labels differ from Kubernetes' in one way: a name may repeat with distinct values
(``region=us-east-1`` and ``region=eu-west-1`` on one journal). A set keeps its labels as a
sorted tuple of unique `Label` pairs, so equal sets compare and hash equal whatever order
they were given in, and every name and value is checked by `gazette.names` on the way in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple, TypeAlias

from gazette.errors import ValidationError
from gazette.names import (
    validate_journal_name,
    validate_label_name,
    validate_label_value,
    validate_shard_id,
)


class Label(NamedTuple):
    """One (name, value) pair; an empty value says only that the label exists."""

    name: str
    value: str = ""


#: What `LabelSet` accepts: pairs (or Labels), or a mapping of name to one or more values.
LabelsLike: TypeAlias = (
    "LabelSet | Iterable[Label | tuple[str, str]] | Mapping[str, str | Iterable[str]]"
)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _check_label(name: object, value: object, name_field: str, value_field: str) -> Label:
    return Label(validate_label_name(name, name_field), validate_label_value(value, value_field))


class LabelSet:
    """An immutable, validated multi-map of label name to values.

    Immutable as `fractions.Fraction` is: slots, private fields, no mutators; which keeps
    the precomputed index and hash valid.

    Built from an iterable of ``(name, value)`` pairs or from a mapping of name to a value
    or an iterable of values; duplicate pairs collapse. Untrusted YAML/JSON goes through
    `from_list` instead, which reports each bad item by its index.
    """

    __slots__ = ("_hash", "_index", "_labels")

    _labels: tuple[Label, ...]
    _index: dict[str, tuple[str, ...]]
    _hash: int

    def __init__(self, labels: LabelsLike = (), *, field: str = "labels") -> None:
        raw: object = labels  # checked at run time too: callers may be untyped
        if isinstance(raw, LabelSet):
            self._init_trusted(raw._labels)
            return
        pairs: list[Label] = []
        if isinstance(raw, Mapping):
            for name, values in raw.items():
                validate_label_name(name, field)
                vfield = f"{field}.{name}"
                if isinstance(values, str):
                    pairs.append(Label(name, validate_label_value(values, vfield)))
                    continue
                if not isinstance(values, Iterable) or isinstance(values, bytes):
                    raise ValidationError(
                        vfield, f"expected a string or strings, got {_type_name(values)}"
                    )
                for j, value in enumerate(values):
                    pairs.append(Label(name, validate_label_value(value, f"{vfield}[{j}]")))
        elif isinstance(raw, Iterable) and not isinstance(raw, str | bytes):
            for i, item in enumerate(raw):
                if not isinstance(item, tuple | list) or len(item) != 2:
                    raise ValidationError(
                        f"{field}[{i}]",
                        f"expected a (name, value) pair, got {_type_name(item)}",
                    )
                pairs.append(
                    _check_label(item[0], item[1], f"{field}[{i}].name", f"{field}[{i}].value")
                )
        else:
            raise ValidationError(
                field, f"expected pairs or a mapping of labels, got {_type_name(raw)}"
            )
        self._init_trusted(pairs)

    def _init_trusted(self, pairs: Iterable[Label]) -> None:
        labels = tuple(sorted(set(pairs)))
        index: dict[str, list[str]] = {}
        for name, value in labels:
            index.setdefault(name, []).append(value)
        self._labels = labels
        self._index = {k: tuple(v) for k, v in index.items()}
        self._hash = hash(labels)

    @classmethod
    def _trusted(cls, pairs: Iterable[Label]) -> LabelSet:
        """A set from pairs that are already valid (or deliberately unchecked, such as
        implicit labels derived from an already-validated journal name)."""
        out = cls.__new__(cls)
        out._init_trusted(Label(n, v) for n, v in pairs)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (LabelSet._trusted, (self._labels,))

    # --- untrusted YAML/JSON form -----------------------------------------------------

    @classmethod
    def from_list(cls, obj: object, field: str = "labels") -> LabelSet:
        """Validate the YAML form ``[{name: ..., value: ...}, ...]`` from an untrusted
        source; a missing or null ``value`` means the label only exists.

        Stricter than the constructor: unknown keys and repeated pairs are errors, since
        in hand-written YAML they are most likely typos.
        """
        if not isinstance(obj, list | tuple):
            raise ValidationError(field, f"expected a list of labels, got {_type_name(obj)}")
        pairs: list[Label] = []
        first_seen: dict[Label, int] = {}
        for i, item in enumerate(obj):
            ifield = f"{field}[{i}]"
            if not isinstance(item, Mapping):
                raise ValidationError(
                    ifield, f"expected a mapping with 'name' and 'value', got {_type_name(item)}"
                )
            for key in item:
                if not isinstance(key, str):
                    raise ValidationError(ifield, f"keys must be strings, got {key!r}")
                if key not in ("name", "value"):
                    raise ValidationError(f"{ifield}.{key}", "unknown field (known: name, value)")
            name = item.get("name")
            if name is None:
                raise ValidationError(f"{ifield}.name", "is required")
            value = item.get("value")
            label = _check_label(
                name, "" if value is None else value, f"{ifield}.name", f"{ifield}.value"
            )
            if label in first_seen:
                raise ValidationError(
                    ifield, f"repeats {field}[{first_seen[label]}] ({label.name}={label.value})"
                )
            first_seen[label] = i
            pairs.append(label)
        return cls._trusted(pairs)

    def to_list(self) -> list[dict[str, str]]:
        """The YAML form, sorted; ``value`` is omitted when empty, as users write it."""
        return [{"name": n, "value": v} if v else {"name": n} for n, v in self._labels]

    # --- queries ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Label]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __contains__(self, item: object) -> bool:
        """``"name" in ls`` asks whether the label exists; ``Label(n, v) in ls`` asks
        for that exact pair."""
        if isinstance(item, str):
            return item in self._index
        if isinstance(item, tuple) and len(item) == 2:
            return item[1] in self._index.get(item[0], ())
        return False

    def values(self, name: str) -> tuple[str, ...]:
        """All values of `name`, sorted; empty if the label is absent."""
        return self._index.get(name, ())

    def value_of(self, name: str) -> str | None:
        """The first (smallest) value of `name`, or None if absent: for single-valued
        labels such as ``content-type``."""
        values = self._index.get(name)
        return values[0] if values else None

    def names(self) -> tuple[str, ...]:
        """Distinct label names, sorted."""
        return tuple(self._index)

    def as_dict(self) -> dict[str, tuple[str, ...]]:
        """A copy of the name → sorted values multi-map."""
        return dict(self._index)

    # --- derived sets ----------------------------------------------------------------

    def union(self, *others: LabelSet) -> LabelSet:
        """Pairs in this set or any of `others`."""
        pairs = set(self._labels)
        for other in others:
            pairs.update(other._labels)
        return LabelSet._trusted(pairs)

    def intersection(self, *others: LabelSet) -> LabelSet:
        """Pairs in this set and in all of `others`."""
        pairs = set(self._labels)
        for other in others:
            pairs.intersection_update(other._labels)
        return LabelSet._trusted(pairs)

    def difference(self, *others: LabelSet) -> LabelSet:
        """Pairs in this set but in none of `others`."""
        pairs = set(self._labels)
        for other in others:
            pairs.difference_update(other._labels)
        return LabelSet._trusted(pairs)

    def __or__(self, other: object) -> LabelSet:
        return self.union(other) if isinstance(other, LabelSet) else NotImplemented

    def __and__(self, other: object) -> LabelSet:
        return self.intersection(other) if isinstance(other, LabelSet) else NotImplemented

    def __sub__(self, other: object) -> LabelSet:
        return self.difference(other) if isinstance(other, LabelSet) else NotImplemented

    def with_label(self, name: str, value: str = "") -> LabelSet:
        """This set plus one validated pair."""
        label = _check_label(name, value, "name", "value")
        return LabelSet._trusted((*self._labels, label))

    def with_values(self, name: str, values: Iterable[str]) -> LabelSet:
        """This set with `name`'s values replaced by `values` (none removes the label)."""
        validate_label_name(name, "name")
        new = [Label(name, validate_label_value(v, f"values[{i}]")) for i, v in enumerate(values)]
        return LabelSet._trusted([*(lb for lb in self._labels if lb.name != name), *new])

    def without(self, name: str, value: str | None = None) -> LabelSet:
        """This set less every value of `name`, or only the pair (`name`, `value`)."""
        return LabelSet._trusted(
            lb
            for lb in self._labels
            if not (lb.name == name and (value is None or lb.value == value))
        )

    # --- identity --------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelSet):
            return NotImplemented
        return self._labels == other._labels

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"LabelSet({[tuple(lb) for lb in self._labels]!r})"


#: The empty set, a convenient immutable default.
EMPTY = LabelSet()

# --- implicit labels -----------------------------------------------------------------

#: Implicit label: a journal's exact name.
NAME = "name"
#: Implicit label: each prefix of a journal name or shard id that ends in ``/``.
PREFIX = "prefix"
#: Implicit label: a shard's exact id.
ID = "id"
#: Labels a journal carries implicitly; specs may not set them.
RESERVED_JOURNAL_LABELS = frozenset({NAME, PREFIX})
#: Labels a shard carries implicitly; specs may not set them.
RESERVED_SHARD_LABELS = frozenset({ID, PREFIX})


def _prefixes(path: str) -> list[Label]:
    return [Label(PREFIX, path[: i + 1]) for i, ch in enumerate(path) if ch == "/"]


def journal_labels(name: str, labels: LabelSet = EMPTY) -> LabelSet:
    """`labels` plus the implicit ``name`` and ``prefix`` labels of journal `name`, which
    is what selectors (``gazctl journals list -l ...``) are matched against.

    Implicit labels are authoritative: any ``name``/``prefix`` in `labels` is dropped.
    Journal names keep to label value characters, so the values need no second check.
    """
    validate_journal_name(name, "name")
    user = (lb for lb in labels if lb.name not in RESERVED_JOURNAL_LABELS)
    return LabelSet._trusted((*user, Label(NAME, name), *_prefixes(name)))


def shard_labels(shard_id: str, labels: LabelSet = EMPTY) -> LabelSet:
    """`labels` plus the implicit ``id`` and ``prefix`` labels of shard `shard_id`;
    as for journals, the implicit labels replace any given ones."""
    validate_shard_id(shard_id, "id")
    user = (lb for lb in labels if lb.name not in RESERVED_SHARD_LABELS)
    return LabelSet._trusted((*user, Label(ID, shard_id), *_prefixes(shard_id)))
