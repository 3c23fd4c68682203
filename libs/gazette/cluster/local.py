"""Local items: this member's assignments, turned into running local objects.

The keyspace is followed incrementally: each change marks the items it touches (a spec,
an assignment; a member's endpoint touches the items served here), and only those are
brought in line, so one change costs the same with ten or ten thousand items. An item to
be served here is opened (`open`, at most `OPEN_CONCURRENCY` at once); an open that
raises `NotReady` leaves the item in `unready` with the reason and is tried again every
`OPEN_RETRY_SECONDS`. Once open, the object's `run()` is a supervised task; it gets each
new spec (`update_spec`) and, in a cluster, each new resolution of its route
(`update_route`); when the item is deleted or moved away, its task is stopped and the
object closed in the background (owned until done; a new open of the same item waits
for it).

In a cluster (a `Resolver` given) only items assigned to this member are opened; without
one, every item is served here alone (an embedded single member).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from gazette.cluster.resolver import Resolution, Resolver
from gazette.keyspace import Event, KeySpace, Layout
from gazette.supervise import Supervisor

log = logging.getLogger(__name__)

#: Items that could not be opened are tried again this often.
OPEN_RETRY_SECONDS = 5
#: Items opened at once.
OPEN_CONCURRENCY = 16
#: Why a local object is closed: its item was deleted; it was moved to other members.
CLOSED_DELETED = "deleted"
CLOSED_MOVED = "no longer assigned here"

SpecT = TypeVar("SpecT")
SpecContra = TypeVar("SpecContra", contravariant=True)


class NotReady(Exception):
    """An item cannot be served yet (for example its stores cannot be listed): the
    message says why, naming it; it is tried again later."""


class LocalItem(Protocol[SpecContra]):
    """What a local object of an item does: run, follow its spec and route, close."""

    async def run(self) -> None: ...

    def update_spec(self, spec: SpecContra) -> None: ...

    def update_route(self, res: Resolution[Any]) -> None: ...

    async def close(self, reason: str) -> None: ...


L = TypeVar("L", bound=LocalItem[Any])


class LocalItems(Generic[SpecT, L]):
    """Local objects (`L`) of the items of type `spec_type` in `keyspace` that this member
    serves; `open(spec)` makes one. `kind` names their tasks (``{kind}:{item}``) and
    metrics."""

    def __init__(self, keyspace: KeySpace[Any], layout: Layout, spec_type: type[SpecT],
                 open: Callable[[SpecT], Awaitable[L]], supervisor: Supervisor, *,
                 resolver: Resolver[SpecT] | None = None, kind: str = "item") -> None:
        self.keyspace, self.layout, self.spec_type = keyspace, layout, spec_type
        self.resolver, self.supervisor, self.kind = resolver, supervisor, kind
        self._open_one = open
        #: Open local objects by item.
        self.items: dict[str, L] = {}
        #: Items with a spec that are not served yet: why, as a sentence naming them.
        self.unready: dict[str, str] = {}
        self._opening: set[str] = set()
        self._closing: dict[str, asyncio.Task[None]] = {}
        self._gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        self._dirty: set[str] = set()
        self._changed = asyncio.Event()
        self._served = asyncio.Event()  # replaced by a fresh one when an item opens
        self._unobserve: Callable[[], None] = lambda: None

    def spec(self, item: str) -> SpecT | None:
        entry = self.keyspace.get(self.layout.item_key(item))
        return entry.value if entry is not None and isinstance(entry.value, self.spec_type) \
            else None

    def _all(self) -> set[str]:
        n = len(self.layout.items)
        return {e.kv.key[n:] for e in self.keyspace.prefixed(self.layout.items)
                if isinstance(e.value, self.spec_type)}

    async def start(self) -> None:
        """Open the items known now, and follow changes (a supervised task)."""
        self._unobserve = self.keyspace.observe(self._on_change)
        self._dirty |= self._all()
        await self._sync(self._take_dirty())
        self.supervisor.spawn(f"{self.kind}-sync", self._follow, transient=())

    def _on_change(self, revision: int, events: list[Event]) -> None:
        items, assigned = self.layout.items, self.layout.assignments
        for ev in events:
            key = ev.kv.key
            if key.startswith(items):
                self._dirty.add(key[len(items):])
            elif self.resolver is None:
                continue
            elif key.startswith(assigned):
                self._dirty.add(key[len(assigned):].rsplit("#", 3)[0])
            elif key.startswith(self.layout.members):
                self._dirty |= self.items.keys()  # endpoints of their routes
        if self._dirty:
            self._changed.set()

    def _take_dirty(self) -> set[str]:
        dirty, self._dirty = self._dirty, set()
        self._changed.clear()
        return dirty

    async def _follow(self) -> None:
        while True:
            await self._changed.wait()
            await self._sync(self._take_dirty())

    def _mark(self, item: str) -> None:
        self._dirty.add(item)
        self._changed.set()

    def wanted(self, item: str) -> SpecT | None:
        """The spec of `item` if this member should serve it now."""
        spec = self.spec(item)
        if spec is None or (self.resolver is not None and not self.resolver.is_assigned(item)):
            return None
        return spec

    def holding(self, assigned: set[str]) -> set[str]:
        """Of the items `assigned` here, those that may hold something to hand over: all
        but those never opened here (in `unready`: a journal whose stores could not be
        listed, say), which a drain need not wait for."""
        return assigned - self.unready.keys()

    async def sync(self) -> None:
        """Bring every item in line with the keyspace (start-up does this; changes are
        followed incrementally after)."""
        await self._sync(self._all() | self.items.keys() | self.unready.keys())

    async def _sync(self, items: set[str]) -> None:
        for item in items:
            spec = self.wanted(item)
            local = self.items.get(item)
            if spec is None:
                self.unready.pop(item, None)
                if local is not None:
                    self._remove(item, local)
                continue
            if local is None:
                if item not in self._opening:
                    self._opening.add(item)
                    self.supervisor.spawn(f"open:{item}", functools.partial(self._open, item),
                                          kind="open", transient=())
                continue
            local.update_spec(spec)
            if self.resolver is not None:
                local.update_route(self.resolver.resolve(item, announced=True))

    async def _open(self, item: str) -> None:
        try:
            closing = self._closing.get(item)
            if closing is not None:  # its last local object is still closing
                await asyncio.shield(closing)
            async with self._gate:
                spec = self.wanted(item)
                if spec is None:
                    return
                try:
                    local = await self._open_one(spec)
                except NotReady as err:
                    reason = str(err)
                    if self.unready.get(item) != reason:
                        log.warning("%s (trying again every %d s)", reason,
                                    OPEN_RETRY_SECONDS)
                    self.unready[item] = reason
                    asyncio.get_running_loop().call_later(
                        OPEN_RETRY_SECONDS, self._mark, item)
                    return
        finally:
            self._opening.discard(item)
        self.unready.pop(item, None)
        self.items[item] = local
        self._mark(item)  # the spec and route of now
        self.supervisor.spawn(f"{self.kind}:{item}", local.run, kind=self.kind)
        self._served.set()
        self._served = asyncio.Event()

    def _remove(self, item: str, local: L) -> None:
        """Stop serving `item` here: its object closes in the background (it may wait
        for work in progress), owned until done."""
        del self.items[item]
        deleted = self.spec(item) is None
        if self.resolver is not None:  # the object learns it is no longer in the route
            local.update_route(self.resolver.resolve(item, announced=True))

        async def close() -> None:
            await self.supervisor.stop(f"{self.kind}:{item}")
            await local.close(CLOSED_DELETED if deleted else CLOSED_MOVED)
            log.info("stopped serving %s (%s)", item,
                     CLOSED_DELETED if deleted else CLOSED_MOVED)

        task = asyncio.create_task(close(), name=f"close:{item}")
        self._closing[item] = task
        task.add_done_callback(functools.partial(self._closed, item))

    def _closed(self, item: str, task: asyncio.Task[None]) -> None:
        if self._closing.get(item) is task:
            del self._closing[item]
        if not task.cancelled() and task.exception() is not None:
            log.error("closing %s failed", item, exc_info=task.exception())

    async def wait_serving(self, items: set[str]) -> None:
        """Return once every one of `items` is open here."""
        while not items <= self.items.keys():
            await self._served.wait()

    async def wait_closed(self) -> None:
        """Return once the objects being closed now are closed."""
        while self._closing:
            await asyncio.gather(*self._closing.values(), return_exceptions=True)

    async def close(self, reason: str) -> None:
        """Stop following the keyspace and close every local object (`reason` says why)."""
        self._unobserve()
        await self.supervisor.stop(f"{self.kind}-sync")
        items = dict(self.items)
        self.items.clear()  # in place: owners may hold the mapping
        for item, local in items.items():
            await self.supervisor.stop(f"{self.kind}:{item}")
            await local.close(reason)
        await asyncio.gather(*self._closing.values(), return_exceptions=True)
