"""The operator's work apart from Kubernetes, against a real etcd: resources become
validated specs at the right keys; each spec has one owning resource (a second is
refused, a removal deletes only what its resource owns, a rename moves the spec, a
stale replica cannot write over a newer generation, a repair after the delete cannot
recreate the spec); drift is found and restored; and a journal's route is read from a
real broker's assignments."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gazette.errors import ValidationError
from gazette.keyspace import Etcd, Layout
from gazette.keyspace.specs import decode_journal, decode_shard
from gazette.protocol import MemberSpec, ProcessId
from gazette_broker import BrokerServer
from gazette_operator.ownership import Deleting, OwnedElsewhere, Owner, Stale, Written
from gazette_operator.sync import (
    JOURNAL_KIND,
    SHARD_KIND,
    SpecWriter,
    declared,
    journal_route,
    unserved,
)
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "operator" / "examples"


def example(name: str, i: int = 0) -> dict[str, Any]:
    return copy.deepcopy(list(yaml.safe_load_all((EXAMPLES / name).read_text()))[i])


def test_resources_declare_specs_at_their_keys() -> None:
    journal = declared(JOURNAL_KIND, example("journals.yaml")["spec"], "/g/cluster")
    assert journal.key == "/g/cluster/items/example/journal"
    assert decode_journal(journal.value).replication == 1
    shard = declared(SHARD_KIND, example("shards.yaml")["spec"], consumer_root="/g/apps")
    assert shard.key == "/g/apps/word-count/items/word-count/split"
    assert decode_shard(shard.value).sources[0].journal == "examples/word-count/lines"


@pytest.mark.parametrize(("kind", "change", "field"), [
    (JOURNAL_KIND, {"replication": 0}, "spec.replication"),
    (JOURNAL_KIND, {"name": "a//b"}, "spec.name"),
    (JOURNAL_KIND, {"fragment": {"compression_codec": "LZ4"}}, "spec.fragment.compression_codec"),
    (JOURNAL_KIND, {"fragment": {"stores": ["s3://Bad_Bucket/"]}}, "spec.fragment.stores[0]"),
    (JOURNAL_KIND, {"unknown": 1}, "spec"),
    (SHARD_KIND, {"app": None}, "spec.app"),
    (SHARD_KIND, {"app": "bad app"}, "spec.app"),
])
def test_invalid_resources_name_the_field(kind: str, change: dict[str, Any],
                                          field: str) -> None:
    spec = example("journals.yaml" if kind == JOURNAL_KIND else "shards.yaml")["spec"]
    spec.update(change)
    with pytest.raises(ValidationError) as err:
        declared(kind, spec)
    assert err.value.field.startswith(field), err.value


def owner(name: str = "first", generation: int = 1, uid: str = "") -> Owner:
    return Owner(JOURNAL_KIND, "default", name, uid or f"uid-{name}", generation)


async def test_writes_are_guarded_and_drift_is_restored(etcd: Etcd, etcd_prefix: str) -> None:
    writer = SpecWriter(etcd, f"{etcd_prefix}-operator")
    spec = example("journals.yaml")["spec"]
    first = declared(JOURNAL_KIND, spec, etcd_prefix)
    done = await writer.write(first, owner())
    assert done.changed and not done.repaired
    again = await writer.write(first, owner())  # already there: nothing written
    assert again == Written(done.revision, False, False, None)

    spec["replication"] = 2  # the resource is updated: a new generation
    second = declared(JOURNAL_KIND, spec, etcd_prefix)
    updated = await writer.write(second, owner(generation=2))
    assert updated.changed and not updated.repaired and updated.revision > done.revision
    assert decode_journal((await etcd.get(second.key))[1].value).replication == 2  # type: ignore[union-attr]

    # Someone edits etcd by hand: the same generation written again is a repair.
    await etcd.put(second.key, first.value)
    repaired = await writer.write(second, owner(generation=2))
    assert repaired.changed and repaired.repaired
    assert (await etcd.get(second.key))[1].value == second.value  # type: ignore[union-attr]
    # Deleted by hand: restored too.
    await etcd.delete_prefix(second.key)
    assert (await writer.write(second, owner(generation=2))).repaired


async def test_one_owner_per_spec(etcd: Etcd, etcd_prefix: str) -> None:
    """A second resource naming the same journal is refused, names the owner, and never
    writes; its removal leaves the owner's spec; once the owner is gone another takes
    over."""
    writer = SpecWriter(etcd, f"{etcd_prefix}-operator")
    spec = example("journals.yaml")["spec"]
    mine = declared(JOURNAL_KIND, spec, etcd_prefix)
    theirs = declared(JOURNAL_KIND, {**spec, "replication": 3}, etcd_prefix)
    await writer.write(mine, owner("first"))
    with pytest.raises(OwnedElsewhere) as err:
        await writer.write(theirs, owner("second"))
    assert err.value.owner == "default/first" and err.value.key == mine.key
    assert (await etcd.get(mine.key))[1].value == mine.value  # type: ignore[union-attr]
    assert await writer.remove(owner("second"), [theirs.key], 60) == []
    assert (await etcd.get(mine.key))[1].value == mine.value  # type: ignore[union-attr]
    # A spec nobody owns (written by gazctl, say) is not removed either.
    await etcd.put(f"{etcd_prefix}/items/by/hand", b"")
    assert await writer.remove(owner("first"), [f"{etcd_prefix}/items/by/hand"], 60) == [mine.key]
    assert (await etcd.get(f"{etcd_prefix}/items/by/hand"))[1] is not None
    assert (await etcd.get(mine.key))[1] is None
    took = await writer.write(theirs, owner("third"))
    assert took.changed and decode_journal(
        (await etcd.get(mine.key))[1].value).replication == 3  # type: ignore[union-attr]


async def test_a_rename_moves_the_spec(etcd: Etcd, etcd_prefix: str) -> None:
    writer = SpecWriter(etcd, f"{etcd_prefix}-operator")
    spec = example("journals.yaml")["spec"]
    old = declared(JOURNAL_KIND, spec, etcd_prefix)
    await writer.write(old, owner())
    new = declared(JOURNAL_KIND, {**spec, "name": "renamed/journal"}, etcd_prefix)
    moved = await writer.write(new, owner(generation=2))
    assert moved.moved_from == old.key
    assert (await etcd.get(old.key))[1] is None and (await etcd.get(new.key))[1] is not None
    assert await writer.remove(owner(generation=2), [], 60) == [new.key]


async def test_a_stale_replica_cannot_overwrite_a_newer_generation(
        etcd: Etcd, etcd_prefix: str) -> None:
    """Two replicas acting at once (peering not settled yet): the one with the older view
    of the resource cannot write over what the newer one wrote."""
    writer = SpecWriter(etcd, f"{etcd_prefix}-operator")
    spec = example("journals.yaml")["spec"]
    newer = declared(JOURNAL_KIND, {**spec, "replication": 2}, etcd_prefix)
    await writer.write(newer, owner(generation=2))
    with pytest.raises(Stale):
        await writer.write(declared(JOURNAL_KIND, spec, etcd_prefix), owner(generation=1))
    assert (await etcd.get(newer.key))[1].value == newer.value  # type: ignore[union-attr]


async def test_a_repair_after_the_delete_cannot_recreate_the_spec(
        etcd: Etcd, etcd_prefix: str) -> None:
    """A drift check in flight when the resource is deleted: its write comes after the
    removal, and is refused by the tombstone; a new resource of the same name (another
    uid) may write it."""
    writer = SpecWriter(etcd, f"{etcd_prefix}-operator")
    d = declared(JOURNAL_KIND, example("journals.yaml")["spec"], etcd_prefix)
    await writer.write(d, owner())
    assert await writer.remove(owner(), [d.key], 60) == [d.key]
    with pytest.raises(Deleting):
        await writer.write(d, owner())
    assert (await etcd.get(d.key))[1] is None
    assert (await writer.write(d, owner(uid="recreated"))).changed


def test_unserved_stores_name_the_scheme_and_what_brokers_serve() -> None:
    s3_only = MemberSpec(ProcessId("z", "a"), "http://a:1", store_schemes=("s3",))
    both = MemberSpec(ProcessId("z", "b"), "http://b:1", store_schemes=("s3", "file"))
    anything = MemberSpec(ProcessId("z", "c"), "http://c:1")
    assert unserved(("file:///x/",), []) is None  # no broker registered: nothing known
    assert unserved(("file:///x/",), [s3_only, both]) is None
    assert unserved(("file:///x/",), [anything]) is None
    why = unserved(("file:///x/",), [s3_only])
    assert why == ("no broker serves file:// stores (the 1 registered broker serves s3://); "
                   "not written until one does")
    two = unserved(("file:///x/",), [s3_only, s3_only])
    assert two is not None and "(the 2 registered brokers serve s3://)" in two


async def test_the_route_of_a_journal_a_broker_serves(broker_server: BrokerServer) -> None:
    writer = SpecWriter(broker_server.etcd, f"{broker_server.layout.root}-operator")
    d = declared(JOURNAL_KIND, {**example("journals.yaml")["spec"],
                                "fragment": {"stores": ["file:///"]}},
                 broker_server.layout.root)
    await writer.write(d, owner())
    layout = Layout(broker_server.layout.root)
    await eventually(lambda: journal_route(broker_server.keyspace, layout,
                                           "example/journal")[0] != "", "assigned")
    primary, replicas = journal_route(broker_server.keyspace, layout, "example/journal")
    assert primary == f"{broker_server.id.zone}/{broker_server.id.suffix}"
    assert replicas == [primary]
