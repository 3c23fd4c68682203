"""Running a shard as its primary: restore, acknowledge again, read, transact, commit.

`ShardRunner.run()` restores the store's checkpoint, appends its ACK intents again (they
commit what the last transaction published, if its ACKs were lost), restores the
Sequencer from its producer states, and reads every source journal from its checkpointed
offset (at least its `min_offset`), read-uncommitted, into a bounded queue of batches.

Transactions then run one after another, each:

- begins when a batch is ready; every message the Sequencer releases from it (committed,
  each once) goes to ``consume_message``;
- takes more batches while they are ready at once, until ``max_txn_duration``; at a
  stall it closes once ``min_txn_duration`` has passed and a commit may start (the
  previous one is done, or fewer than the store's ``commits_in_flight`` are under way:
  so at low rates a transaction is one batch and latency stays low; at high rates it
  grows to thousands of messages);
- closes: ``finalize_txn``, then the checkpoint (offsets read through, producer states,
  the ACK intents of what the transaction published, and those of commits still under
  way whose ACKs are not appended yet) goes to the store's commit, which first waits for
  the transaction's appends. The next transaction runs meanwhile (pipelined), unless the
  store says its transactions read what the last one wrote (``pipelined = False``,
  `SQLStore`'s default, asked at each transaction): the next one then begins once the
  commit is done. Up to the store's ``commits_in_flight`` commits (1 unless it says
  more: `SQLiteStore` on its recovery log) are under way at once. Once a commit is done
  (and the one before it, with its ACKs) its ACKs are appended. What the next
  transaction publishes meanwhile is held back and appended after those ACKs: an ACK
  read after its producer's messages of larger clocks would roll them back.

A failed commit or ACK fails the run (the shard is marked failed by its owner); a
transaction whose messages were consumed but not committed is consumed again after a
restart, from the store's last checkpoint: effects in the store happen exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import Counter, Histogram

from gazette.client import JournalClient, ReadChunk
from gazette.consumer.app import Application
from gazette.consumer.app_shard import Shard
from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.lag import ShardLag
from gazette.consumer.recovery import Recovery, run_recovered
from gazette.consumer.store import Store
from gazette.errors import GazetteError
from gazette.message import (
    PRUNE_HORIZON,
    AckIntent,
    AppendClient,
    Envelope,
    Framing,
    Publisher,
    Sequencer,
    drain,
    framing_for,
    read_uncommitted,
)
from gazette.protocol import JournalSpec, ShardSpec
from gazette.recoverylog import Player, RecordedFolder
from gazette.recoverylog import Progress as PlayProgress
from gazette.supervise import cancel_and_wait, settle

log = logging.getLogger(__name__)

TXN_SECONDS = Histogram("gazette_consumer_txn_seconds",
                        "Consumer transactions: from their first message to their close",
                        buckets=(.001, .005, .01, .05, .1, .5, 1, 5))
TXN_MESSAGES = Histogram("gazette_consumer_txn_messages",
                         "Messages consumed per consumer transaction",
                         buckets=(1, 10, 100, 1000, 10_000, 100_000))
COMMIT_SECONDS = Histogram("gazette_consumer_commit_seconds",
                           "Consumer transactions: from their close to their commit and ACKs",
                           buckets=(.001, .005, .01, .05, .1, .5, 1, 5))
MESSAGES = Counter("gazette_consumer_messages_total",
                   "Read-committed messages consumed by shards")

#: Batches (each up to about a read chunk of messages) read ahead per shard.
READ_AHEAD_BATCHES = 8


Batch = tuple[str, list[Envelope]]
#: Reads the envelopes of a journal from one offset to another (the Sequencer's replay).
Replay = Callable[[str, int, int], AsyncIterator[list[Envelope]]]


class SourceError(GazetteError):
    """A source journal of a shard cannot be read (it does not exist, or has no framing
    for its content type): the message names the shard and the journal."""


class _Appends:
    """The Publisher's append client: collects the appends of each transaction, for
    its commit to wait on. While a transaction commits, the appends of the next one are
    held back (`hold`), and go after its ACKs (`release`): in a journal, an ACK rolls
    back its producer's pending messages of larger clocks, so the next transaction's
    messages must not precede it. With several commits under way, each holds its own
    group: a release lets out the oldest group only."""

    def __init__(self, inner: AppendClient) -> None:
        self.inner = inner
        self.pending: list[asyncio.Future[Any]] = []
        self._held: collections.deque[list[tuple[str, bytes, asyncio.Future[Any]]]] = \
            collections.deque()

    def append(self, journal: str, data: bytes) -> asyncio.Future[Any]:
        if not self._held:
            fut = self.inner.append(journal, data)
        else:
            fut = asyncio.get_running_loop().create_future()
            self._held[-1].append((journal, data, fut))
        self.pending.append(fut)
        return fut

    def take(self) -> list[asyncio.Future[Any]]:
        out, self.pending = self.pending, []
        return out

    def hold(self) -> None:
        """Hold appends from now on, until the `release` that matches this hold."""
        self._held.append([])

    def release(self) -> None:
        """Append what the oldest hold held, in order (and, if no hold is left,
        appends from now on at once)."""
        held = self._held.popleft() if self._held else []
        for journal, data, fut in held:
            self.inner.append(journal, data).add_done_callback(functools.partial(settle, fut))

    def drop(self) -> None:
        """The run ends: what was held is never appended."""
        while self._held:
            for _, _, fut in self._held.popleft():
                fut.cancel()


async def _maybe(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


class ShardRunner:
    """Runs `shard` of `app` as primary: reads its sources through `client`, appends
    what it publishes (and ACKs) through `appender` (an `AppendQueue`, say)."""

    def __init__(self, shard_spec: ShardSpec, app: Application, client: JournalClient,
                 appender: AppendClient, recovery: Recovery | None = None) -> None:
        self.app, self.client, self.appender = app, client, appender
        self.recovery = recovery
        #: A hot standby's player, stopped: the runner hands off from it (set before
        #: `run`).
        self.standby: Player | None = None
        #: Told of recovery-log playback progress.
        self.on_progress: Callable[[PlayProgress], None] | None = None
        self._appends = _Appends(appender)
        self.shard = Shard(shard_spec, Publisher(self._appends))
        self._carry: Batch | None = None  # a batch taken while a transaction closed
        #: Commits (and their ACKs) under way, oldest first, owned here (cancelled with
        #: the run); with the ACK intents of each, until its ACKs are appended.
        self._commits: collections.deque[asyncio.Future[None]] = collections.deque()
        self._unacked: dict[asyncio.Future[None], list[AckIntent]] = {}
        #: Its lag behind its sources (the heads its reads see; what it commits).
        self._lag = ShardLag(shard_spec.id)
        #: Called once the store is restored and the sources found: processing starts.
        self.on_restored: Callable[[], None] | None = None
        #: The shard's store while it is restored and running (queries read it: it
        #: holds the open transaction's effects too).
        self.store: Store | None = None

    @property
    def spec(self) -> ShardSpec:
        return self.shard.spec

    async def run(self) -> None:
        """Until cancelled (or a failure, raised)."""
        if self.spec.recovery_log is None:
            await self._run()
            return
        if self.recovery is None:
            raise GazetteError(f"shard {self.spec.id} has a recovery log, but the runner "
                               "was given no recovery (etcd, local folder)")
        await run_recovered(self.client, self.recovery, self.spec, self._run_recorded,
                            self.on_progress, self.standby)

    async def _run_recorded(self, folder: RecordedFolder) -> None:
        """Run on the store's folder, recovered from the log (the hot standby, if any,
        handed its player over)."""
        self.standby = None
        self.shard.folder = folder
        try:
            await self._run()
        finally:
            self.shard.folder = None

    async def _run(self) -> None:
        store: Store = await _maybe(self.app.new_store(self.shard))
        try:
            checkpoint = await store.restore_checkpoint()
            await self._acknowledge([AckIntent(j, d) for j, d in
                                     checkpoint.ack_intents.items()])
            sequencer = Sequencer(checkpoint.producers, buffer=self.spec.ring_buffer_size)
            offsets = {s.journal: max(checkpoint.sources.get(s.journal, 0), s.min_offset)
                       for s in self.spec.sources}
            self.shard.progress.restored(offsets)
            self._lag.committed(offsets)
            framings = {j: await self._framing(j) for j in offsets}
            self.store = store
            if self.on_restored is not None:
                self.on_restored()
            queue: asyncio.Queue[Batch] = asyncio.Queue(maxsize=READ_AHEAD_BATCHES)
            try:
                async with asyncio.TaskGroup() as group:
                    for journal, offset in offsets.items():
                        group.create_task(self._read(journal, offset, framings[journal],
                                                     queue),
                                          name=f"read:{self.spec.id}:{journal}")
                    await self._transact(store, sequencer, offsets, framings, queue)
            except ExceptionGroup as failed:
                # The first failure (the app's, a commit's, a read's) is the run's: raised
                # itself, so that the shard's status names it rather than the group.
                raise failed.exceptions[0] from failed
        finally:
            self.store = self.shard.txn = None
            self._lag.close()
            self._appends.drop()
            try:
                for fut in self._commits:
                    if not fut.done():
                        await cancel_and_wait(fut)
            finally:
                self._commits.clear()
                self._unacked.clear()
                await store.close()

    async def _framing(self, journal: str) -> Framing:
        listing = await self.client.list(f"name={journal}")
        spec = next((j.spec for j in listing.journals if j.spec.name == journal), None)
        if spec is None:
            raise SourceError(f"shard {self.spec.id}: source journal {journal} does not "
                              "exist")
        return self._framing_of(spec)

    def _framing_of(self, spec: JournalSpec) -> Framing:
        content_type = (spec.labels.values("content-type") or ("",))[0]
        message_type = self.app.message_type(spec)
        try:
            if message_type is None:
                return framing_for(content_type)
            return framing_for(content_type, message_type=message_type)
        except GazetteError as err:
            raise SourceError(f"shard {self.spec.id}: source journal {spec.name}: "
                              f"{err}") from None

    async def _read(self, journal: str, offset: int, framing: Framing,
                    queue: asyncio.Queue[Batch]) -> None:
        lag = self._lag

        async def contents(chunks: AsyncIterator[ReadChunk]
                           ) -> AsyncIterator[bytes | bytearray]:
            async for chunk in chunks:
                lag.saw_head(journal, chunk.write_head)
                yield chunk.content

        async with contextlib.aclosing(self.client.read(journal, offset, block=True)) as chunks:
            batches = read_uncommitted(journal, contents(chunks), framing, offset)
            source = self.app.read_source(self.shard, journal, offset, batches)
            try:
                async for batch in source:
                    await queue.put((journal, batch))
            finally:  # the app's source, then ours (the same object by default)
                for gen in (source, batches) if source is not batches else (source,):
                    aclose = getattr(gen, "aclose", None)
                    if aclose is not None:
                        await aclose()

    def _replay(self, framings: dict[str, Framing]) -> Replay:
        async def replay(journal: str, begin: int, end: int) -> AsyncIterator[list[Envelope]]:
            async with contextlib.aclosing(
                    self.client.read(journal, begin, end_offset=end)) as chunks:
                async for batch in read_uncommitted(journal, _contents(chunks),
                                                    framings[journal], begin):
                    yield batch
        return replay

    async def _acknowledge(self, intents: list[AckIntent]) -> None:
        """Append `intents` (queued at once, in call order) and wait for them; appends
        held while the last transaction committed follow them."""
        acks = [self.appender.append(i.journal, i.data) for i in intents]
        self._appends.release()
        if acks:
            await asyncio.gather(*acks)

    async def _transact(self, store: Store, sequencer: Sequencer, offsets: dict[str, int],
                        framings: dict[str, Framing], queue: asyncio.Queue[Batch]) -> None:
        loop = asyncio.get_running_loop()
        app, shard, publisher = self.app, self.shard, self.shard.publisher
        consume = app.consume_message
        consume_async = inspect.iscoroutinefunction(consume)
        replay = self._replay(framings)
        max_txn = self.spec.max_txn_duration.total_seconds()
        min_txn = self.spec.min_txn_duration.total_seconds()
        commits = self._commits
        commit: asyncio.Future[None] | None = None
        while True:
            batch = await self._first(queue)
            envelopes = await self._sequence(batch, sequencer, replay, offsets)
            if not envelopes:
                continue  # nothing committed yet: no transaction (the offsets go with the next)
            # Asked each transaction: a store may need its last commit done first (its
            # reads must see what it wrote, or it rewrites itself at that commit).
            if not getattr(store, "pipelined", True) and commit is not None \
                    and not commit.done():
                await asyncio.wait({commit})
                commit.result()  # a failed commit fails the run here
            # (Asked each transaction too: a store may allow more while it rewrites.)
            limit = max(1, int(getattr(store, "commits_in_flight", 1)))
            started = loop.time()
            shard.txn = app.txn_state(shard)  # nothing of an abandoned transaction's
            await _maybe(app.begin_txn(shard, store))
            count = 0
            while True:
                for env in envelopes:
                    try:
                        if consume_async:
                            await consume(shard, store, env, publisher)
                        else:
                            consume(shard, store, env, publisher)
                    except Exception as err:
                        # Where it failed goes with the error to the shard's log line.
                        err.add_note(f"consume_message of {env.journal} at offset "
                                     f"{env.begin}")
                        raise
                count += len(envelopes)
                gate = commits[0] if len(commits) >= limit else None
                item = await self._next(queue, gate, started + min_txn, started + max_txn)
                if item is None:
                    break
                envelopes = await self._sequence(item, sequencer, replay, offsets)
            await _maybe(app.finalize_txn(shard, store, publisher))
            closed = loop.time()
            TXN_SECONDS.observe(closed - started)
            TXN_MESSAGES.observe(count)
            MESSAGES.inc(count)
            intents = publisher.build_ack_intents()
            # The intents of commits under way whose ACKs are not appended yet go into
            # this checkpoint too (this transaction's override them per journal): were
            # it durable and the process gone before those ACKs, a restore from it
            # appends them.
            owed = {i.journal: i for f in commits for i in self._unacked.get(f, ())}
            owed.update((i.journal, i) for i in intents)
            checkpoint = Checkpoint.of(offsets, sequencer.producer_states(PRUNE_HORIZON),
                                       list(owed.values()))
            while len(commits) >= limit:
                await commits.popleft()  # its commit and ACKs: a failure is raised here
            while commits and commits[0].done():
                commits.popleft().result()
            log.debug("shard %s: transaction of %d messages closes through %s", shard.id,
                      count, offsets)
            commit = store.start_commit(checkpoint, self._appends.take())
            self._appends.hold()  # until its ACKs are queued: see _Appends
            await _maybe(app.finished_txn(shard, store, commit))
            done = asyncio.ensure_future(self._committed(
                commit, intents, dict(offsets), count, closed,
                commits[-1] if commits else None))
            self._unacked[done] = intents
            commits.append(done)

    async def _first(self, queue: asyncio.Queue[Batch]) -> Batch:
        """The next transaction's first batch. Meanwhile a failure of a commit under
        way is raised: a shard left idle after a failed commit must not look healthy."""
        if self._carry is not None:
            batch, self._carry = self._carry, None
            return batch
        for fut in self._commits:
            if fut.done():
                fut.result()
        if not self._commits:
            return await queue.get()
        getter = asyncio.ensure_future(queue.get())
        try:
            commits: set[asyncio.Future[Any]] = set(self._commits)
            while not getter.done():
                done, _ = await asyncio.wait({getter, *commits},
                                             return_when=asyncio.FIRST_COMPLETED)
                for fut in done & commits:
                    fut.result()  # raises a failed commit
                commits -= done
            return getter.result()
        finally:
            getter.cancel()  # (a no-op once it is done)

    @staticmethod
    async def _sequence(batch: Batch, sequencer: Sequencer, replay: Replay,
                        offsets: dict[str, int]) -> list[Envelope]:
        """The committed envelopes `batch` releases, each once; its journal's offset
        moves past it."""
        journal, envelopes = batch
        sequencer.queue_all(envelopes)
        out = await drain(sequencer, replay)
        offsets[journal] = envelopes[-1].end
        return out

    async def _next(self, queue: asyncio.Queue[Batch], previous: asyncio.Future[None] | None,
                    min_at: float, max_at: float) -> Batch | None:
        """The next batch of the open transaction, or None to close it: at
        `max_at`, or at a stall once `min_at` has passed and `previous` (the commit
        whose end frees a place for this one's, if none is free) committed."""
        loop = asyncio.get_running_loop()
        getter: asyncio.Future[Batch] | None = None
        try:
            while True:
                if getter is not None and getter.done():
                    batch = getter.result()
                    getter = None
                    return batch
                now = loop.time()
                if now >= max_at:
                    return None
                if getter is None and not queue.empty():
                    return queue.get_nowait()
                if now >= min_at and (previous is None or previous.done()):
                    return None
                if getter is None:
                    getter = asyncio.ensure_future(queue.get())
                waits: set[asyncio.Future[Any]] = {getter}
                if previous is not None and not previous.done():
                    waits.add(previous)
                await asyncio.wait(waits, timeout=(min_at if now < min_at else max_at) - now,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            if getter is not None:
                if getter.done() and not getter.cancelled():
                    self._carry = getter.result()  # the next transaction starts with it
                else:
                    getter.cancel()

    async def _committed(self, commit: Awaitable[None], intents: list[AckIntent],
                         offsets: dict[str, int], count: int, closed: float,
                         before: asyncio.Future[None] | None) -> None:
        """Once `commit` is done, and the commit `before` it with its ACKs: append the
        ACKs, count the transaction."""
        await commit
        if before is not None:
            await before
        await self._acknowledge(intents)
        current = asyncio.current_task()
        if current is not None:
            self._unacked.pop(current, None)
        COMMIT_SECONDS.observe(asyncio.get_running_loop().time() - closed)
        self.shard.progress.record(offsets, count)
        self._lag.committed(offsets)


async def _contents(chunks: AsyncIterator[ReadChunk]) -> AsyncIterator[bytes | bytearray]:
    async for chunk in chunks:
        yield chunk.content
