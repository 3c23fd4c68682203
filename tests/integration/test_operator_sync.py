"""The operator's work apart from Kubernetes, against a real etcd: resources become
validated specs at the right keys, writes are revision-guarded, drift is found and
restored, removal never deletes someone else's change, and a journal's route is read
from a real broker's assignments."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gazette.errors import ValidationError
from gazette.keyspace import Etcd, Layout
from gazette.keyspace.specs import decode_journal, decode_shard
from gazette_broker import BrokerServer
from gazette_operator.sync import (
    JOURNAL_KIND,
    SHARD_KIND,
    Conflict,
    SpecWriter,
    declared,
    journal_route,
)
from tests.fixtures.polling import eventually

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "operator" / "examples"


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


async def test_writes_are_guarded_and_drift_is_restored(etcd: Etcd, etcd_prefix: str) -> None:
    writer = SpecWriter(etcd)
    spec = example("journals.yaml")["spec"]
    first = declared(JOURNAL_KIND, spec, etcd_prefix)
    rev = await writer.write(first, 0)
    assert await writer.write(first, 0) == rev  # already there: nothing written

    spec["replication"] = 2  # the resource is updated
    second = declared(JOURNAL_KIND, spec, etcd_prefix)
    rev2 = await writer.write(second, rev)
    assert rev2 > rev and decode_journal((await writer.observe(second.key)).value).replication == 2

    # Someone edits etcd by hand: the next write refuses to clobber it...
    await etcd.put(second.key, first.value)
    with pytest.raises(Conflict):
        await writer.write(second, rev2)
    # ...and the drift check restores the declared spec.
    drifted, rev3 = await writer.restore(second)
    assert drifted and (await writer.observe(second.key)).value == second.value
    assert await writer.restore(second) == (False, rev3)
    # Deleted by hand: restored too.
    await etcd.delete_prefix(second.key)
    drifted, rev4 = await writer.restore(second)
    assert drifted and rev4 > rev3

    # Removal deletes only what the operator wrote.
    await etcd.put(second.key, first.value)
    with pytest.raises(Conflict):
        await writer.remove(second.key, rev4)
    _, rev5 = await writer.restore(second)
    assert await writer.remove(second.key, rev5)
    assert (await writer.observe(second.key)).mod_revision == 0
    assert not await writer.remove(second.key, rev5)  # gone already: nothing to do


async def test_the_route_of_a_journal_a_broker_serves(broker_server: BrokerServer) -> None:
    writer = SpecWriter(broker_server.etcd)
    d = declared(JOURNAL_KIND, example("journals.yaml")["spec"],
                 broker_server.layout.root)
    await writer.write(d, 0)
    layout = Layout(broker_server.layout.root)
    await eventually(lambda: journal_route(broker_server.keyspace, layout,
                                           "example/journal")[0] != "", "assigned")
    primary, replicas = journal_route(broker_server.keyspace, layout, "example/journal")
    assert primary == f"{broker_server.id.zone}/{broker_server.id.suffix}"
    assert replicas == [primary]
