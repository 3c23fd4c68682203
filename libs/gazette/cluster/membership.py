"""This process as a member of a cluster (brokers) or of a consumer application.

A member is its `MemberSpec` under a lease: written when it joins, gone with the lease
when it dies or leaves, so the allocator moves its items to others. Every member runs the
allocator (the oldest one leads). A member acts as one only while its lease is surely
held: `live()` is false from `LEASE_MARGIN` seconds before the lease could expire
unrefreshed (by then etcd may let another member take its items), and true again once
etcd, answering again, says the lease is alive (`watch_liveness` tells the member's
items). A member leaves only when etcd says its lease is gone (`wait`): an etcd restart,
however long, renews every lease. Stopping starts with a drain: the spec asks for no
items (limit 0, under the same lease), and the member waits until the allocator has
moved every one away, before its RPCs drain and the lease goes.

Starting members may come up before etcd (as on Kubernetes): each step of joining is
retried, logged, until a deadline (`until_etcd`). The lease is kept alive from the moment
it is granted, and one that ends before the member key is written and seen is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from gazette.allocator import Allocator, Assignment, route_consistent
from gazette.cluster.coverage import COVERAGE
from gazette.keyspace import Etcd, EtcdError, KeySpace, Layout, Lease, LeaseLost, LeaseNotFound
from gazette.keyspace.specs import encode_broker
from gazette.protocol import MemberSpec, ProcessId
from gazette.supervise import Supervisor

#: Seconds between checks of what is still assigned while draining.
DRAIN_RECHECK = 1.0
log = logging.getLogger(__name__)
T = TypeVar("T")

#: The default lease TTL: a dead member's items move after at most this long (failover
#: measured 3-4 s by benchmarks/failover_bench.py), while keepalives (every quarter of
#: it) ride out a stall of 3 s without flapping (none in 10 minutes with both cores busy).
DEFAULT_LEASE_TTL = 4
#: A member stops acting as one this long before its lease would run out unrefreshed.
LEASE_MARGIN = 1.0
#: How long a starting member waits for etcd to answer before it gives up.
DEFAULT_ETCD_STARTUP_TIMEOUT = 60.0


async def until_etcd(etcd: Etcd, what: str, op: Callable[[], Awaitable[T]],
                     deadline: float, timeout: float) -> T:
    """`op()`, tried again while etcd does not answer (it may be starting with this
    member), until the loop time `deadline` (`timeout` after the start: for the
    message); each wait is logged."""
    loop = asyncio.get_running_loop()
    delay = 0.2
    while True:
        try:
            return await op()
        except LeaseNotFound:
            raise  # (etcd answered: trying again would not help)
        except EtcdError as err:
            left = deadline - loop.time()
            if left <= 0:
                raise EtcdError(f"etcd at {etcd.endpoint} did not answer within "
                                f"{timeout:.0f}s ({what}): {err}") from None
            wait = min(delay, left)
            log.warning("waiting for etcd at %s (%s: %s); trying again in %.1fs",
                        etcd.endpoint, what, err, wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, 5.0)


class Membership:
    """The member `me` of the cluster under `layout`: join (with its spec), run the
    allocator, drain, leave. `encode` stores a member spec (brokers' and consumers'
    differ);
    `replication_of`, `stores_of` and `is_consistent` tell the allocator about items."""

    def __init__(self, etcd: Etcd, keyspace: KeySpace[Any], layout: Layout,
                 me: ProcessId, *, lease_ttl: int = DEFAULT_LEASE_TTL,
                 encode: Callable[[MemberSpec], bytes] = encode_broker,
                 replication_of: Callable[[Any], int] = lambda spec: int(spec.replication),
                 stores_of: Callable[[Any], tuple[str, ...]] | None = None,
                 is_consistent: Callable[[str, Assignment, Sequence[Assignment]], bool]
                 = route_consistent,
                 startup_timeout: float = DEFAULT_ETCD_STARTUP_TIMEOUT,
                 kind: str = "journal") -> None:
        self.etcd, self.keyspace, self.layout = etcd, keyspace, layout
        self.me, self.lease_ttl, self._encode = me, lease_ttl, encode
        self.startup_timeout = startup_timeout
        self.key = layout.member_key(me.zone, me.suffix)
        #: The spec this member joined with (None: not joined).
        self.spec: MemberSpec | None = None
        self.allocator = Allocator(etcd, keyspace, layout, me,
                                   replication_of=replication_of,
                                   is_consistent=is_consistent, stores_of=stores_of)
        self.lease: Lease | None = None
        #: `kind` names the items in metrics (``gazette_cluster_items{kind}``).
        COVERAGE.add(self.allocator, kind)

    def deadline(self) -> float:
        """The loop time by which a member starting now must have joined."""
        return asyncio.get_running_loop().time() + self.startup_timeout

    async def until_etcd(self, what: str, op: Callable[[], Awaitable[T]],
                         deadline: float) -> T:
        return await until_etcd(self.etcd, what, op, deadline, self.startup_timeout)

    async def load(self, deadline: float) -> None:
        """Load the keyspace (retried while etcd does not answer) and follow it."""
        await self.until_etcd("loading the cluster's state", self.keyspace.load, deadline)
        await self.keyspace.__aenter__()

    async def join(self, spec: MemberSpec, supervisor: Supervisor, deadline: float
                   ) -> None:
        """Take a lease and keep it alive from then on (a supervised task), write `spec`
        under it and wait until the keyspace shows this member. A lease that ends
        meanwhile (the write took longer than its TTL) is replaced by a new one."""
        if spec.id != self.me:
            raise ValueError(f"member spec of {spec.id}, not of {self.me}")
        self.spec = spec
        while not await self._join_under_new_lease(spec, supervisor, deadline):
            assert self.lease is not None
            await supervisor.stop("lease")
            log.warning("lease %x ended before this member joined under it: taking a "
                        "new one", self.lease.id)
            if asyncio.get_running_loop().time() >= deadline:
                raise EtcdError(f"etcd at {self.etcd.endpoint}: this member's leases "
                                f"ended before it could join within "
                                f"{self.startup_timeout:.0f}s")

    async def _join_under_new_lease(self, spec: MemberSpec, supervisor: Supervisor,
                                    deadline: float) -> bool:
        """Whether this member joined under a new lease (False: the lease ended first)."""
        lease = self.lease = await self.until_etcd(
            "granting this member's lease",
            lambda: Lease.grant(self.etcd, self.lease_ttl), deadline)
        supervisor.spawn("lease", functools.partial(_keep_alive, lease), transient=())
        try:
            revision = await self.until_etcd(
                "announcing this member", lambda: self.etcd.put(
                    self.key, self._encode(spec), lease=lease.id), deadline)
        except LeaseNotFound:
            return False
        loop = asyncio.get_running_loop()
        seen = asyncio.ensure_future(self.keyspace.wait_for_revision(
            revision, timeout=max(1.0, deadline - loop.time())))
        lost = asyncio.ensure_future(lease.lost.wait())
        try:
            await asyncio.wait({seen, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not seen.done():
                seen.cancel()
        if lease.lost.is_set():
            return False
        seen.result()  # (a timeout raises)
        return True

    def run_allocator(self, supervisor: Supervisor) -> None:
        """Run the allocator as a supervised task (etcd errors restart it)."""
        supervisor.spawn("allocator", self.allocator.run, transient=(EtcdError, OSError))

    def ready(self) -> bool:
        """Whether this member holds its lease (it may serve health checks)."""
        return self.lease is not None and not self.lease.lost.is_set()

    def live(self) -> bool:
        """Whether this member may still act as one: its lease is surely held
        (refreshed recently enough that etcd cannot have expired it)."""
        return self.lease is not None and not self.lease.lost.is_set() and \
            self.lease.remaining > LEASE_MARGIN

    async def watch_liveness(self, changed: Callable[[bool], None]) -> None:
        """Until cancelled (or the lease is lost): call `changed(live())` whenever
        `live()` changes: false when the lease goes unrefreshed into its last
        `LEASE_MARGIN` seconds, true again once etcd refreshed it."""
        assert self.lease is not None, "join() first"
        lease, live = self.lease, self.live()
        while not lease.lost.is_set():
            if live:
                # Nothing can change it but time: refreshes only push it further off.
                await asyncio.sleep(max(lease.remaining - LEASE_MARGIN, 0.01))
            else:
                await lease.wait_refreshed()
            if self.live() != live:
                live = not live
                log.log(logging.INFO if live else logging.WARNING,
                        "member %s %s", self.me, "acts on its assignments again: etcd "
                        "refreshed its lease" if live else "stops acting on its "
                        "assignments: its lease may have run out (etcd does not answer)")
                changed(live)

    async def drain(self, assigned: Callable[[], set[str]], timeout: float) -> bool:
        """Ask for no items (member spec limit 0, under the same lease) and wait until
        `assigned()` is empty. Returns whether that happened in `timeout`."""
        if not self.ready():
            return False
        assert self.lease is not None and self.spec is not None
        draining = replace(self.spec, item_limit=0)
        await self.etcd.put(self.key, self._encode(draining), lease=self.lease.id)
        changed = asyncio.Event()
        stop = self.keyspace.observe(lambda revision, events: changed.set())
        try:
            async with asyncio.timeout(timeout):
                while assigned():
                    # A change in etcd, or a second at most: `assigned` may also change
                    # with local state (an item found to hold nothing here).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), DRAIN_RECHECK)
                    changed.clear()
        except TimeoutError:
            log.warning("draining: items still assigned here after %.0fs: %s", timeout,
                        sorted(assigned())[:20])
            return False
        finally:
            stop()
        log.info("drained: no item is assigned here any more")
        return True

    async def wait(self, supervisor: Supervisor) -> None:
        """Return only when this member can no longer serve: its lease is lost (raises
        `LeaseLost`), or a task it cannot do without failed for good (raises
        `TaskFailed`)."""
        assert self.lease is not None, "join() first"
        lost = asyncio.ensure_future(self.lease.lost.wait())
        failed = asyncio.ensure_future(supervisor.wait_failed())
        try:
            await asyncio.wait({lost, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            failed.cancel()
        if failed.done() and not failed.cancelled() and failed.exception() is not None:
            raise failed.exception()  # type: ignore[misc]
        raise LeaseLost(f"member {self.me}: lease lost")

    async def leave(self) -> None:
        """Revoke the lease (the member spec and assignments go with it), stop following
        the keyspace, and close the etcd client."""
        COVERAGE.discard(self.allocator)
        if self.lease is not None:
            await self.lease.revoke()
        await self.keyspace.__aexit__(None, None, None)
        await self.etcd.close()


async def _keep_alive(lease: Lease) -> None:
    """A member's keepalive: `lease.lost` (which `Membership.wait` and `join` watch) says
    the lease ended; the task itself just ends."""
    with contextlib.suppress(LeaseLost):
        await lease.keep_alive()
