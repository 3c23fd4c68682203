"""Handlers and what happens when one fails.

A `Handler` is a named function of one topic, of one kind (idempotent, exactly-once,
broadcast), with a failure policy. `dispatch` runs the handlers of a list of raw events
(as read from a journal): it decodes each into the topic's model, cuts batches, limits
concurrent invocations, applies each invocation's timeout, and routes every failure (an
exception, a timeout, or data that does not fit the model) through the handler's policy.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gazette.errors import ValidationError
from gazette.events import metrics
from gazette.events.topic import Event, EventTypeError, Topic, validate_name

log = logging.getLogger("gazette.events")

#: Backoff of a blocked handler: first wait, and the most it grows to.
BLOCK_INITIAL, BLOCK_MAX = 0.1, 30.0


class OnFailure(enum.Enum):
    """What a failed event becomes, for the handler that failed it."""

    #: Logged and counted, then dropped for this handler.
    DISCARD = "discard"
    #: Retried in place with backoff until it succeeds: its group waits meanwhile.
    BLOCK = "block"
    #: Sent to the group's retry journal and handled again after `retry_delay`, up to
    #: `max_attempts` in all; then saved as a dead letter.
    RETRY_LATER = "retry-later"
    #: Saved to the group's dead-letter journal for a person to inspect and replay
    #: (``gazctl events dead-letters``, ``gazctl events replay``).
    SAVE = "save"


class Kind(enum.Enum):
    IDEMPOTENT = "idempotent"
    EXACTLY_ONCE = "exactly-once"
    BROADCAST = "broadcast"


@dataclass
class Handler:
    """`fn(event)` (or `fn(tx, event)` for exactly-once; a list of events when
    `batch_size` is set), named `name` in logs and metrics."""

    name: str
    topic: Topic[Any]
    fn: Callable[..., Awaitable[Any]]
    kind: Kind
    on_failure: OnFailure = OnFailure.DISCARD
    #: None: one event per call; n: lists of up to n events.
    batch_size: int | None = None
    #: Invocations at once (idempotent and broadcast; exactly-once handlers share one
    #: database transaction, so theirs run one at a time).
    concurrency: int = 1
    #: Seconds one invocation may take; beyond, it fails (and is cancelled).
    timeout: float = 30.0
    retry_delay: float = 30.0
    max_attempts: int = 5

    def __post_init__(self) -> None:
        validate_name(self.name, "handler")
        if not asyncio.iscoroutinefunction(self.fn):
            raise ValidationError(f"handler {self.name}", "must be an async function")
        if self.batch_size is not None and not 1 <= self.batch_size <= 100_000:
            raise ValidationError(f"handler {self.name}: batch_size",
                                  f"must be in [1, 100000], got {self.batch_size}")
        if not 1 <= self.concurrency <= 1000:
            raise ValidationError(f"handler {self.name}: concurrency",
                                  f"must be in [1, 1000], got {self.concurrency}")
        for what, value in (("timeout", self.timeout), ("retry_delay", self.retry_delay)):
            if not value > 0:
                raise ValidationError(f"handler {self.name}: {what}", f"must be > 0, got {value}")
        if self.max_attempts < 1:
            raise ValidationError(f"handler {self.name}: max_attempts", "must be at least 1")
        if self.kind is Kind.BROADCAST and self.on_failure not in (OnFailure.DISCARD,
                                                                   OnFailure.BLOCK):
            raise ValidationError(f"handler {self.name}: on_failure", (
                "a broadcast handler has no group, so no retry or dead-letter journal: "
                "use discard or block"))


@dataclass
class Item:
    """A raw event as read (its JSON line as a dict), where it was read, and, once
    decoded for a handler's topic, the event or why it does not decode."""

    raw: dict[str, Any]
    journal: str
    offset: int


class Failures(Protocol):
    """Where failed events go: a group's retry and dead-letter journals."""

    def retry(self, handler: Handler, item: Item, error: str, attempt: int) -> None: ...

    def dead(self, handler: Handler, item: Item, error: str, attempt: int) -> None: ...


class Transaction(Protocol):
    """What exactly-once dispatch needs of the open database transaction."""

    async def begin(self) -> None: ...
    async def fresh(self, handler: Handler, ids: list[str]) -> set[str]: ...
    async def commit(self) -> None: ...
    async def rollback(self) -> None: ...
    @property
    def connection(self) -> Any: ...


def decode(topic: Topic[Any], item: Item) -> Event[Any]:
    """The event of `item` (raises EventTypeError for a line that is not an event of
    `topic`'s model)."""
    raw = item.raw
    event_id = str(raw.get("id", ""))
    if "data" not in raw or not event_id:
        raise EventTypeError(f"topic {topic.name}: {item.journal}@{item.offset} is not an "
                             "event (no 'id' or 'data')")
    return Event(topic.name, event_id, str(raw.get("key", "")), float(raw.get("time", 0)),
                 topic.from_data(raw["data"], event_id), item.journal, item.offset,
                 int(raw.get("attempt", 0)))


async def dispatch(group: str, handler: Handler, items: Sequence[Item], *,
                   failures: Failures | None = None, tx: Transaction | None = None,
                   stopping: asyncio.Event | None = None) -> None:
    """Run `handler` over `items` (in order for concurrency 1), routing failures."""
    events: list[tuple[Item, Event[Any]]] = []
    for item in items:
        try:
            events.append((item, decode(handler.topic, item)))
        except EventTypeError as err:
            await _failed(group, handler, [item], err, failures,
                          retry=lambda it=item: _decodes(handler, it))  # type: ignore[misc]
    if not events:
        return
    size = handler.batch_size or 1
    batches = [events[i:i + size] for i in range(0, len(events), size)]
    if tx is not None:
        for batch in batches:
            await _run(group, handler, batch, failures, tx, stopping)
        return
    limit = asyncio.Semaphore(handler.concurrency)

    async def one(batch: list[tuple[Item, Event[Any]]]) -> None:
        async with limit:
            await _run(group, handler, batch, failures, None, stopping)

    if handler.concurrency == 1:
        for batch in batches:
            await one(batch)
    else:
        async with asyncio.TaskGroup() as tasks:
            for batch in batches:
                tasks.create_task(one(batch))


async def _decodes(handler: Handler, item: Item) -> None:
    decode(handler.topic, item)


async def _run(group: str, handler: Handler, batch: list[tuple[Item, Event[Any]]],
               failures: Failures | None, tx: Transaction | None,
               stopping: asyncio.Event | None) -> None:
    """One invocation (retried in place under BLOCK)."""

    async def attempt() -> None:
        evs = [ev for _, ev in batch]
        if tx is not None:
            await tx.begin()
            try:
                fresh = await tx.fresh(handler, list(dict.fromkeys(ev.id for ev in evs)))
                if len(fresh) < len(evs):
                    metrics.SKIPPED.labels(group, handler.topic.name, handler.name).inc(
                        len(evs) - len(fresh))
                    evs = _first_of_each(evs, fresh)
                if evs:
                    await _call(group, handler, evs, tx.connection)
            except BaseException:
                await tx.rollback()
                raise
            await tx.commit()
        else:
            await _call(group, handler, evs, None)
        metrics.CONSUMED.labels(group, handler.topic.name, handler.name).inc(len(evs))

    try:
        await attempt()
    except (Exception, TimeoutError) as err:  # noqa: BLE001 - every failure has a policy
        await _failed(group, handler, [item for item, _ in batch], err, failures,
                      retry=attempt, stopping=stopping)


def _first_of_each(evs: list[Event[Any]], fresh: set[str]) -> list[Event[Any]]:
    """The events whose ids are `fresh`, each id once (its first copy: a re-sent event
    may share a batch with the original)."""
    out = []
    for ev in evs:
        if ev.id in fresh:
            fresh.discard(ev.id)
            out.append(ev)
    return out


async def _call(group: str, handler: Handler, evs: list[Event[Any]], conn: Any) -> None:
    args: list[Any] = [] if conn is None else [conn]
    args.append(evs if handler.batch_size is not None else evs[0])
    started = time.perf_counter()
    try:
        async with asyncio.timeout(handler.timeout):
            await handler.fn(*args)
    except TimeoutError:
        raise TimeoutError(f"handler {handler.name} took more than its timeout "
                           f"({handler.timeout:g} s)") from None
    finally:
        metrics.HANDLER_SECONDS.labels(group, handler.name).observe(
            time.perf_counter() - started)


async def _failed(group: str, handler: Handler, items: list[Item], err: BaseException,
                  failures: Failures | None, *, retry: Callable[[], Awaitable[None]],
                  stopping: asyncio.Event | None = None) -> None:
    """Route the failure of `items` by the handler's policy."""
    policy = handler.on_failure
    topic = handler.topic.name
    error = f"{type(err).__name__}: {err}"
    ids = ", ".join(str(it.raw.get("id", f"{it.journal}@{it.offset}")) for it in items[:5])
    metrics.FAILURES.labels(group, topic, handler.name, policy.value).inc(len(items))
    log.warning("handler %s (group %s, topic %s) failed on %d event(s) [%s]: %s; policy %s",
                handler.name, group or "-", topic, len(items), ids, error, policy.value,
                extra={"handler": handler.name, "group": group, "topic": topic,
                       "policy": policy.value, "error": error})
    if policy is OnFailure.DISCARD:
        return
    if policy is OnFailure.BLOCK:
        await _block(group, handler, retry, stopping)
        return
    assert failures is not None, "retry-later and save need a group"
    for item in items:
        attempt = int(item.raw.get("attempt", 0)) + 1
        if policy is OnFailure.RETRY_LATER and attempt < handler.max_attempts:
            failures.retry(handler, item, error, attempt)
        else:
            failures.dead(handler, item, error, attempt)


async def _block(group: str, handler: Handler, retry: Callable[[], Awaitable[None]],
                 stopping: asyncio.Event | None) -> None:
    """Retry until it succeeds (the group waits), with backoff; stops with the shard."""
    delay = BLOCK_INITIAL
    while True:
        wait = delay * random.uniform(0.75, 1.25)
        if stopping is not None:
            try:
                await asyncio.wait_for(stopping.wait(), wait)
                raise asyncio.CancelledError("the shard is stopping")
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(wait)
        delay = min(delay * 2, BLOCK_MAX)
        try:
            await retry()
            return
        except (Exception, TimeoutError) as err:  # noqa: BLE001 - blocked: retried again
            metrics.FAILURES.labels(group, handler.topic.name, handler.name,
                                    OnFailure.BLOCK.value).inc()
            log.warning("handler %s (group %s) still failing, blocked (next try in "
                        "%.1f s): %s: %s", handler.name, group or "-", delay,
                        type(err).__name__, err)
