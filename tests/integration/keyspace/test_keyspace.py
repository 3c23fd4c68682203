"""KeySpace, transactions and leases against a real etcd."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

import gazette.keyspace.keyspace as keyspace_module
from gazette.keyspace import Etcd, Event, KeySpace, KeyValue, Lease, LeaseLost, Txn, TxnConflict
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration

DEADLINE = 20.0


def text(kv: KeyValue) -> str:
    if kv.value.startswith(b"!"):
        raise ValueError("not text")
    return kv.value.decode()


class Recorder:
    """Records every change a keyspace applies, in the order it applies them."""

    def __init__(self, ks: KeySpace[str]) -> None:
        self.changes: list[tuple[int, str, str | None]] = []
        self.revisions: list[int] = []
        ks.observe(self)

    def __call__(self, revision: int, events: list[Event]) -> None:
        self.revisions.append(revision)
        for ev in events:
            self.changes.append(
                (ev.kv.mod_revision, ev.kv.key, None if ev.deleted else ev.kv.value.decode())
            )


async def eventually(check: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


async def test_load_reads_existing_keys_and_decodes(etcd: Etcd, etcd_prefix: str) -> None:
    await etcd.put(f"{etcd_prefix}/b", b"two")
    rev = await etcd.put(f"{etcd_prefix}/a", b"one")
    await etcd.put(f"{etcd_prefix}x/outside", b"not mine")
    ks = KeySpace(etcd, etcd_prefix + "/", text)
    await ks.load()
    assert ks.revision >= rev
    assert [(e.key, e.value) for e in ks] == [(f"{etcd_prefix}/a", "one"),
                                              (f"{etcd_prefix}/b", "two")]
    assert ks.get(f"{etcd_prefix}/a") is not None
    assert [e.value for e in ks.prefixed(f"{etcd_prefix}/b")] == ["two"]


async def test_two_keyspaces_see_each_others_writes_in_revision_order(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with Etcd(etcd_server.endpoint) as c1, Etcd(etcd_server.endpoint) as c2:
        ks1, ks2 = KeySpace(c1, etcd_prefix, text), KeySpace(c2, etcd_prefix, text)
        r1, r2 = Recorder(ks1), Recorder(ks2)
        async with ks1, ks2:
            written: list[tuple[int, str, str | None]] = []

            async def writer(client: Etcd, name: str) -> None:
                for i in range(40):
                    key = f"{etcd_prefix}/{name}/{i % 7}"
                    if i % 5 == 4:
                        rev = await client.delete_prefix(key)
                        written.append((rev, key, None))
                    else:
                        rev = await client.put(key, f"{name}{i}".encode())
                        written.append((rev, key, f"{name}{i}"))

            async with asyncio.TaskGroup() as tg:
                tg.create_task(writer(c1, "one"))
                tg.create_task(writer(c2, "two"))
            last = max(rev for rev, _, _ in written)
            await ks1.wait_for_revision(last, timeout=DEADLINE)
            await ks2.wait_for_revision(last, timeout=DEADLINE)

        # Deleting an absent key writes nothing: etcd gives no new revision for it.
        expected = sorted({(r, k, v) for r, k, v in written if r > 0}, key=lambda c: c[0])
        expected = [c for c in expected if not (c[2] is None and not _existed(written, c))]
        assert r1.changes == r2.changes
        assert [c[0] for c in r1.changes] == sorted(c[0] for c in r1.changes)
        assert r1.changes == expected
        assert r1.revisions == sorted(r1.revisions)
        assert {e.key: e.value for e in ks1} == {e.key: e.value for e in ks2}


def _existed(written: list[tuple[int, str, str | None]], change: tuple[int, str, str | None]
             ) -> bool:
    """Whether the key a delete names held a value just before it."""
    rev, key, _ = change
    before = [c for c in written if c[1] == key and c[0] < rev]
    return bool(before) and max(before)[2] is not None


async def test_watch_survives_etcd_restart_and_misses_no_event(
    etcd_restartable: EtcdServer, etcd_prefix: str
) -> None:
    async with Etcd(etcd_restartable.endpoint) as client:
        ks = KeySpace(client, etcd_prefix, text)
        rec = Recorder(ks)
        async with ks:
            expected = []
            for i in range(10):
                rev = await client.put(f"{etcd_prefix}/k{i}", f"v{i}".encode())
                expected.append((rev, f"{etcd_prefix}/k{i}", f"v{i}"))
            await ks.wait_for_revision(expected[-1][0], timeout=DEADLINE)

            # Writes the watch has not delivered yet when etcd crashes.
            for i in range(10, 15):
                rev = await client.put(f"{etcd_prefix}/k{i}", f"v{i}".encode())
                expected.append((rev, f"{etcd_prefix}/k{i}", f"v{i}"))
            etcd_restartable.kill()
            etcd_restartable.start()

            async def put_when_up(i: int) -> None:
                deadline = time.monotonic() + DEADLINE
                while True:
                    try:
                        rev = await client.put(f"{etcd_prefix}/k{i}", f"v{i}".encode())
                        expected.append((rev, f"{etcd_prefix}/k{i}", f"v{i}"))
                        return
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.05)

            for i in range(15, 25):
                await put_when_up(i)
            await ks.wait_for_revision(expected[-1][0], timeout=DEADLINE)
            assert ks.watch_restarts >= 1
        assert rec.changes == expected
        assert len(ks) == 25
        labels = {"prefix": etcd_prefix}
        assert REGISTRY.get_sample_value("gazette_keyspace_watch_restarts_total", labels) >= 1
        assert REGISTRY.get_sample_value("gazette_keyspace_keys", labels) == 25
        assert REGISTRY.get_sample_value("gazette_keyspace_revision", labels) == ks.revision


async def test_wait_for_revision_outside_the_prefix(etcd: Etcd, etcd_prefix: str) -> None:
    ks = KeySpace(etcd, etcd_prefix + "/mine/", text)
    async with ks:
        rev = await etcd.put(etcd_prefix + "/other/key", b"x")
        await ks.wait_for_revision(rev, timeout=DEADLINE)  # via a progress notification
        assert ks.revision >= rev
        with pytest.raises(TimeoutError, match="did not reach revision"):
            await ks.wait_for_revision(rev + 1_000_000, timeout=0.3)


async def test_a_watch_that_answers_nothing_is_started_again(
    etcd_server: EtcdServer, etcd_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker's keyspace stayed behind for good after etcd was frozen (found by the
    hardening fault test). A watch stream that answers nothing, not even the progress
    it asks for, is started again. Its stream goes through a relay that holds etcd's
    answers here."""
    monkeypatch.setattr(keyspace_module, "WATCH_PROGRESS_SECONDS", 0.2)
    monkeypatch.setattr(keyspace_module, "WATCH_STALL_SECONDS", 1.0)
    async with Relay(etcd_server.endpoint.removeprefix("http://")) as relay, \
            Etcd(f"http://{relay.address}") as relayed, Etcd(etcd_server.endpoint) as direct, \
            KeySpace(relayed, etcd_prefix, lambda kv: kv.value) as keyspace:
        restarts = keyspace.watch_restarts
        relay.hold_down = True  # the stream stays open; its answers never come
        revision = await direct.put(etcd_prefix + "k", b"v")
        deadline = time.monotonic() + 10
        while keyspace.watch_restarts == restarts:  # nothing else ends that stream
            assert time.monotonic() < deadline, "the stalled watch was never restarted"
            await asyncio.sleep(0.05)
        relay.hold_down = False
        relay.cut()  # (held bytes were dropped: that connection is useless now)
        await keyspace.wait_for_revision(revision, timeout=10)
        assert keyspace.get(etcd_prefix + "k") is not None


async def test_keys_that_do_not_decode_are_skipped(etcd: Etcd, etcd_prefix: str) -> None:
    await etcd.put(f"{etcd_prefix}/bad", b"!garbage")
    ks = KeySpace(etcd, etcd_prefix, text)
    async with ks:
        assert f"{etcd_prefix}/bad" not in ks and ks.decode_errors == 1
        rev = await etcd.put(f"{etcd_prefix}/good", b"fine")
        rev = await etcd.put(f"{etcd_prefix}/good", b"!broken") if rev else rev
        await ks.wait_for_revision(rev, timeout=DEADLINE)
        assert f"{etcd_prefix}/good" not in ks and ks.decode_errors == 2
        rev = await etcd.put(f"{etcd_prefix}/bad", b"repaired")
        await ks.wait_for_revision(rev, timeout=DEADLINE)
        entry = ks.get(f"{etcd_prefix}/bad")
        assert entry is not None and entry.value == "repaired"
        assert REGISTRY.get_sample_value("gazette_keyspace_decode_errors_total",
                                         {"prefix": etcd_prefix}) == 2


async def test_watch_reloads_after_compaction(etcd: Etcd, etcd_prefix: str) -> None:
    await etcd.put(f"{etcd_prefix}/gone", b"1")
    ks = KeySpace(etcd, etcd_prefix, text)
    rec = Recorder(ks)
    await ks.load()
    await etcd.delete_prefix(f"{etcd_prefix}/gone")
    await etcd.put(f"{etcd_prefix}/new", b"2")
    rev = await etcd.put(f"{etcd_prefix}/new", b"3")
    await etcd.compact(rev)
    task = asyncio.create_task(ks.watch())
    try:
        await ks.wait_for_revision(rev, timeout=DEADLINE)
        assert {e.key: e.value for e in ks} == {f"{etcd_prefix}/new": "3"}
        assert (rev, f"{etcd_prefix}/new", "3") in rec.changes
        assert any(c[1] == f"{etcd_prefix}/gone" and c[2] is None for c in rec.changes)
    finally:
        task.cancel()


async def test_txn_applies_when_revisions_match(etcd: Etcd, etcd_prefix: str) -> None:
    key = f"{etcd_prefix}/spec"
    created = await Txn().expect(key, 0).put(key, b"v1").commit(etcd)
    updated = await Txn().expect(key, created.revision).put(key, b"v2").commit(etcd)
    assert updated.revision > created.revision
    _, kv = await etcd.get(key)
    assert kv is not None and kv.value == b"v2" and kv.mod_revision == updated.revision


async def test_stale_compare_fails_cleanly(etcd: Etcd, etcd_prefix: str) -> None:
    a, b = f"{etcd_prefix}/a", f"{etcd_prefix}/b"
    first = await Txn().expect(a, 0).expect(b, 0).put(a, b"1").put(b, b"1").commit(etcd)
    concurrent = await etcd.put(b, b"someone else")

    with pytest.raises(TxnConflict) as err:
        await (Txn().expect(a, first.revision).expect(b, first.revision)
               .put(a, b"2").delete(b).commit(etcd))
    assert err.value.stale == [(b, first.revision, concurrent)]
    assert f"expected mod revision {first.revision}, found mod revision {concurrent}" in str(
        err.value)
    # Nothing was written: a keeps its value, b was not deleted.
    assert (await etcd.get(a))[1].value == b"1"  # type: ignore[union-attr]
    assert (await etcd.get(b))[1].value == b"someone else"  # type: ignore[union-attr]

    with pytest.raises(TxnConflict, match="expected absent, found mod revision"):
        await Txn().expect(a, 0).put(a, b"create again").commit(etcd)


async def test_lease_keeps_keys_alive_and_revoke_deletes_them(
    etcd: Etcd, etcd_prefix: str
) -> None:
    key = f"{etcd_prefix}/member"
    async with await Lease.grant(etcd, ttl=2) as lease:
        await etcd.put(key, b"alive", lease=lease.id)
        start = time.monotonic()
        # Outlive the TTL twice over: the keepalive loop must keep the key.
        while time.monotonic() - start < 4.5:
            assert (await etcd.get(key))[1] is not None, "key expired despite keepalive"
            await asyncio.sleep(0.5)
        assert not lease.lost.is_set()
    assert lease.lost.is_set()
    assert (await etcd.get(key))[1] is None


async def test_lease_lost_when_revoked_elsewhere(etcd_server: EtcdServer, etcd: Etcd) -> None:
    lease = await Lease.grant(etcd, ttl=2)
    task = asyncio.create_task(lease.keep_alive())
    async with Etcd(etcd_server.endpoint) as other:
        await other.lease_revoke(lease.id)
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(task, DEADLINE)
    assert lease.lost.is_set()
