"""A member's lease through etcd faults (issue 34, items 15 and 17), on a real etcd.

- etcd down for longer than the lease's TTL, then back: the member stops acting on its
  assignments while its own clock says the lease may have run out (`live()` false), but
  it does not leave: etcd renews every lease when it restarts, and once etcd answers,
  the member goes on under the same lease with its member key kept.
- a join that takes longer than the lease's TTL (the member key written, the keyspace
  slow to show it) keeps the lease alive meanwhile; a lease that ends anyway is replaced
  and the member joins under a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gazette.cluster import Membership
from gazette.keyspace import Decoder, Etcd, KeySpace, Layout
from gazette.protocol import MemberSpec, ProcessId
from gazette.supervise import Supervisor
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.polling import eventually
from tests.fixtures.relay import Relay

pytestmark = pytest.mark.integration

ME = ProcessId("zone-a", "member")


@contextlib.asynccontextmanager
async def joined(endpoint: str, prefix: str, ttl: int, keyspace_endpoint: str = ""
                 ) -> AsyncIterator[tuple[Membership, Supervisor]]:
    """A member (joined by the caller) whose keyspace follows etcd at
    `keyspace_endpoint` (default: `endpoint`)."""
    layout = Layout(prefix)
    etcd = Etcd(endpoint, timeout=2.0)
    followed = Etcd(keyspace_endpoint, timeout=2.0) if keyspace_endpoint else etcd
    keyspace: KeySpace[Any] = KeySpace(followed, layout.root + "/", Decoder(layout))
    membership = Membership(etcd, keyspace, layout, ME, lease_ttl=ttl,
                            startup_timeout=60)
    supervisor = Supervisor()
    await etcd.connect()
    if followed is not etcd:
        await followed.connect()
    try:
        await membership.load(membership.deadline())
        yield membership, supervisor
    finally:
        await supervisor.close()
        await membership.leave()
        if followed is not etcd:
            await followed.close()


def spec(membership: Membership) -> MemberSpec:
    return MemberSpec(ME, "http://127.0.0.1:1", 10)


async def test_a_member_outlives_an_etcd_restart_longer_than_its_lease(
        etcd_restartable: EtcdServer, etcd_prefix: str) -> None:
    ttl = 4  # the default
    async with joined(etcd_restartable.endpoint, etcd_prefix, ttl) as (membership, sup):
        await membership.join(spec(membership), sup, membership.deadline())
        lease = membership.lease
        assert lease is not None and membership.live()
        waiting = asyncio.create_task(membership.wait(sup))

        await asyncio.to_thread(etcd_restartable.stop)
        # Its own clock runs out: it stops acting on its assignments...
        await eventually(lambda: not membership.live(), "the member stops acting", 2 * ttl)
        await eventually(lambda: lease.remaining < 0, "the lease runs out by our clock",
                         2 * ttl)
        assert not waiting.done(), "the member left while etcd was down"
        await asyncio.to_thread(etcd_restartable.start)
        # ...and acts again once etcd has renewed the lease it kept.
        await eventually(membership.live, "the member acts again", 4 * ttl)
        assert not waiting.done() and not lease.lost.is_set()
        async with Etcd(etcd_restartable.endpoint) as other:
            _, kv = await other.get(membership.key)
            assert kv is not None and kv.lease == lease.id, "the member key was kept"
            assert await other.lease_ttl(lease.id) > 0
        waiting.cancel()


async def test_a_lease_that_etcd_expired_ends_the_member_once_etcd_answers(
        etcd_server: EtcdServer, etcd_prefix: str) -> None:
    ttl = 2
    async with Relay(etcd_server.endpoint.removeprefix("http://")) as relay, \
            joined(f"http://{relay.address}", etcd_prefix, ttl) as (membership, sup):
        await membership.join(spec(membership), sup, membership.deadline())
        lease = membership.lease
        assert lease is not None
        waiting = asyncio.create_task(membership.wait(sup))
        relay.refuse = True  # cut off from etcd, which runs on: the lease expires there
        relay.cut()
        async with Etcd(etcd_server.endpoint) as other:
            await eventually(lambda: _expired(other, lease.id), "etcd expired the lease",
                             4 * ttl)
        assert not lease.lost.is_set(), "only etcd says the lease is gone"
        relay.refuse = False
        await eventually(waiting.done, "the member ends once etcd answers", 4 * ttl)
        with pytest.raises(Exception, match="lease lost"):
            waiting.result()
        assert lease.lost.is_set()


async def _expired(etcd: Etcd, lease_id: int) -> bool:
    return await etcd.lease_ttl(lease_id) < 0  # (0: it still exists, for under 1 s)


async def test_a_slow_join_keeps_its_lease_alive_or_takes_a_new_one(
        etcd_server: EtcdServer, etcd_prefix: str) -> None:
    """Issue 34, item 17: the member key is written, but the keyspace shows it only
    much later (as a first write that timed out would): the lease must not expire
    meanwhile; and one that ends anyway is replaced."""
    ttl = 2
    async with Relay(etcd_server.endpoint.removeprefix("http://")) as relay, \
            Etcd(etcd_server.endpoint) as other, \
            joined(etcd_server.endpoint, etcd_prefix, ttl,
                   keyspace_endpoint=f"http://{relay.address}") as (membership, sup):
        relay.hold_down = True  # the keyspace hears nothing from now on
        joining = asyncio.create_task(membership.join(spec(membership), sup,
                                                      membership.deadline()))

        async def written() -> bool:
            return (await other.get(membership.key))[1] is not None

        await eventually(written, "the member key is written", 10)
        first = membership.lease
        assert first is not None and not joining.done()
        # Twice its TTL later it is still alive: refreshed while the join waits.
        loop = asyncio.get_running_loop()
        since = loop.time()
        while loop.time() - since < 2 * ttl:  # a state that must hold over a time
            assert await other.lease_ttl(first.id) >= 0, "the lease expired while joining"
            await asyncio.sleep(0.2)
        assert not joining.done()
        # It ends anyway (revoked here, as an expiry would end it): a new one is taken.
        await other.lease_revoke(first.id)
        await eventually(lambda: membership.lease is not first, "a new lease is taken", 10)
        relay.hold_down = False
        relay.cut()  # the keyspace reconnects and catches up
        await asyncio.wait_for(joining, 20)
        lease = membership.lease
        assert lease is not None and lease.id != first.id and membership.ready()
        _, kv = await other.get(membership.key)
        assert kv is not None and kv.lease == lease.id
