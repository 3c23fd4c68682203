"""Specs as people write them: YAML spec trees in, validated changes out, and back.

`spectree` knows the shape of a tree; this module knows what its leaves mean. Each leaf
becomes a `SpecChange`: the spec to upsert (or a delete), guarded by the etcd mod revision
the writer last saw (``revision``; 0 or absent means "must not exist yet").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gazette.errors import ValidationError
from gazette.protocol.fields import FieldReader
from gazette.protocol.journal_spec import JournalSpec
from gazette.protocol.shard_spec import ShardSpec
from gazette.spectree import JOURNALS, SHARDS, TreeKind, dump_yaml, fold, load_yaml

S = TypeVar("S", JournalSpec, ShardSpec)


# Not slots=True: with it, CPython 3.11's frozen __setattr__ breaks ``SpecChange[JournalSpec](...)``
# (a TypeError from super() on the replaced class).
@dataclass(frozen=True)
class SpecChange(Generic[S]):
    """Upsert `spec` (or delete `name` when `spec` is None) if the item is still at
    mod revision `revision` (0: if it does not exist)."""

    name: str
    revision: int
    spec: S | None

    @property
    def is_delete(self) -> bool:
        return self.spec is None


def _changes(flat: list[dict[str, Any]], kind: TreeKind,
             parse: Callable[[dict[str, Any]], S]) -> list[SpecChange[S]]:
    out: list[SpecChange[S]] = []
    for item in flat:
        name = item.get(kind.name_key)
        where = str(name)
        try:
            spec_fields = dict(item)
            meta = FieldReader({k: spec_fields.pop(k) for k in ("revision", "delete")
                                if k in spec_fields})
            revision = meta.integer("revision", 0, lo=0)
            delete = meta.boolean("delete", False)
            meta.done()
            spec: S | None = None
            if not delete:
                spec = parse(spec_fields)
            elif not isinstance(name, str):
                raise ValidationError(kind.name_key, "a delete names the item to delete")
            out.append(SpecChange(where, revision, spec))
        except ValidationError as err:
            raise ValidationError(f"{where}: {err.field}" if err.field else where,
                                  err.reason) from None
    return out


def journal_changes_from_yaml(text: str) -> list[SpecChange[JournalSpec]]:
    """Journal changes from ``gazctl journals apply``-style YAML (trees, one or more docs)."""
    return _changes(load_yaml(text, JOURNALS), JOURNALS, JournalSpec.from_dict)


def shard_changes_from_yaml(text: str) -> list[SpecChange[ShardSpec]]:
    """Shard changes from YAML spec trees (leaves named by ``id``)."""
    return _changes(load_yaml(text, SHARDS), SHARDS, ShardSpec.from_dict)


def specs_to_yaml(specs: Iterable[tuple[JournalSpec | ShardSpec, int]]) -> str:
    """The smallest YAML tree of these specs, each leaf with its mod ``revision``."""
    flat, kind = [], JOURNALS
    for spec, revision in specs:
        kind = SHARDS if isinstance(spec, ShardSpec) else JOURNALS
        d = spec.to_dict()
        if revision:
            d["revision"] = revision
        flat.append(d)
    return dump_yaml(fold(flat, kind), kind) if flat else ""
