"""Checkpoints round-trip and refuse what is not one; stores commit state with the
checkpoint atomically, after what they wait for, and keep the next transaction's
changes out of a commit under way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gazette.consumer import Checkpoint, JSONFileStore, MemoryStore
from gazette.errors import ValidationError
from gazette.message import AckIntent, ProducerState


def sample() -> Checkpoint:
    return Checkpoint.of({"a/one": 120, "a/two": 0},
                         [ProducerState("a/one", 0x0102030405, 77, -1),
                          ProducerState("a/one", 0xFFFFFFFFFFFF, 90, 64, 95)],
                         [AckIntent("out/x", b'{"uuid":"..."}\n')])


def test_a_checkpoint_round_trips() -> None:
    cp = sample()
    again = Checkpoint.decode(cp.encode())
    assert again == cp
    assert again.encode() == cp.encode()  # deterministic


def test_what_is_not_a_checkpoint_is_refused() -> None:
    with pytest.raises(ValidationError, match="checkpoint: not a Checkpoint"):
        Checkpoint.decode(b"\xff\xff\xff")
    bad = sample().to_pb()
    bad.sources["a/one"].producers[0].id = b"\x01"
    with pytest.raises(ValidationError, match="expected 6 bytes"):
        Checkpoint.from_pb(bad)


async def test_a_memory_store_commits_a_snapshot_after_its_appends() -> None:
    store = MemoryStore()
    assert await store.restore_checkpoint() == Checkpoint()
    store.state["k"] = 1
    appended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(sample(), [appended])
    store.state["k"] = 2  # the next transaction, meanwhile
    await asyncio.sleep(0)
    assert not commit.done() and store.committed == {}  # waits for its appends
    appended.set_result(None)
    await commit
    assert store.committed == {"k": 1} and store.checkpoint == sample()
    assert await store.restore_checkpoint() == sample()
    assert store.state == {"k": 1}  # uncommitted changes are rolled back


async def test_a_failed_append_fails_the_commit() -> None:
    store = MemoryStore()
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(OSError("append failed"))
    with pytest.raises(OSError, match="append failed"):
        await store.start_commit(sample(), [failed])
    assert store.commits == 0


async def test_a_json_file_store_is_one_whole_commit(tmp_path: Path) -> None:
    path = tmp_path / "shard" / "state.json"
    store = JSONFileStore(path)
    assert await store.restore_checkpoint() == Checkpoint()
    store.state["words"] = {"a": 1}
    commit = store.start_commit(sample(), [])
    store.state["words"] = {"a": 2}  # not in the commit under way
    await commit
    again = JSONFileStore(path)
    assert await again.restore_checkpoint() == sample()
    assert again.state == {"words": {"a": 1}}
    assert not path.with_name("state.json.tmp").exists()


@pytest.mark.parametrize(("content", "reason"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"state": 1, "checkpoint": ""}', "not a JSONFileStore file"),
    ('{"state": {}, "checkpoint": "!!"}', "checkpoint"),
])
async def test_a_damaged_json_file_is_named(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(ValidationError, match=reason) as err:
        await JSONFileStore(path).restore_checkpoint()
    assert str(path) in str(err.value)
    assert path.read_text() == content
