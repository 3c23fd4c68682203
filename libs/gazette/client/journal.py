"""`JournalClient`: appends, reads, listings and spec changes against a broker.

Retries. Transport failures (the broker restarting, a cut connection) are retried with
jittered backoff, but never so that an acknowledged append could land twice:

- an append that failed before its commit message was sent is retried (nothing of it can
  have committed);
- one whose commit was sent but whose answer was lost is *uncertain*. With an expected
  `offset`, the client resolves it: it retries at the same offset; a WRONG_APPEND_OFFSET
  then means something was written there, and the client reads those bytes back and
  compares their SHA-1 with its own: equal means the first attempt committed (success),
  else the append failed. Without an offset it raises `AppendUncertain`.

A reader resumes after a failure at the next offset it has not yielded, so it never yields
a byte twice nor skips one.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc
from prometheus_client import Counter

from gazette import names
from gazette.client.errors import (
    AppendUncertain,
    ApplyConflict,
    BrokerError,
    Unavailable,
)
from gazette.client.fetch import fetch_fragment
from gazette.errors import ValidationError
from gazette.fragment import Fragment, fragment_from_pb
from gazette.labels import LabelSet, Selector
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import (
    JournalSpec,
    journal_spec_from_pb,
    journal_spec_to_pb,
    labels_from_pb,
    labels_to_pb,
    selector_to_pb,
)
from gazette.protocol.convert import duration_to_pb
from gazette.protocol.trees import SpecChange

log = logging.getLogger(__name__)

APPENDS = Counter("gazette_client_appends_total", "Appends committed by this client")
APPEND_BYTES = Counter("gazette_client_append_bytes_total", "Bytes appended by this client")
RETRIES = Counter("gazette_client_retries_total", "Requests retried after transport errors",
                  ["op"])
READ_BYTES = Counter("gazette_client_read_bytes_total", "Bytes read by this client")

#: Content per Append message: large messages cost far less per byte over gRPC.
MESSAGE_BYTES = 1 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]
#: Transport failures worth retrying.
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED}

Content = bytes | memoryview | Iterable[bytes] | AsyncIterable[bytes]


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all, waiting `initial` seconds (doubling up to `max_delay`,
    with ±50 % jitter) between them."""

    attempts: int = 8
    initial: float = 0.05
    max_delay: float = 2.0

    def delays(self) -> Iterable[float]:
        delay = self.initial
        for _ in range(self.attempts - 1):
            yield delay * random.uniform(0.5, 1.5)
            delay = min(delay * 2, self.max_delay)


@dataclass(frozen=True)
class AppendResult:
    commit: Fragment
    registers: LabelSet


@dataclass(frozen=True)
class ReadChunk:
    offset: int
    content: bytes
    fragment: Fragment
    write_head: int


@dataclass(frozen=True)
class Route:
    """Which brokers serve a journal: members as ``zone/suffix``, the primary's index."""

    members: tuple[str, ...] = ()
    primary: int = -1
    endpoints: tuple[str, ...] = ()

    @property
    def primary_member(self) -> str:
        return self.members[self.primary] if 0 <= self.primary < len(self.members) else ""

    @classmethod
    def from_pb(cls, msg: Any) -> Route:
        return cls(tuple(f"{m.zone}/{m.suffix}" for m in msg.members), msg.primary,
                   tuple(msg.endpoints))


@dataclass(frozen=True)
class ListedJournal:
    spec: JournalSpec
    mod_revision: int
    create_revision: int
    route: Route


@dataclass(frozen=True)
class Listing:
    revision: int
    journals: list[ListedJournal]


@dataclass(frozen=True)
class FragmentInfo:
    fragment: Fragment
    signed_url: str


def parse_address(address: str) -> str:
    """A gRPC target from ``host:port``, ``http://host:port`` or ``grpc://host:port``."""
    if not isinstance(address, str) or not address.strip():
        raise ValidationError("address", "expected host:port or http://host:port")
    for scheme in ("http://", "https://", "grpc://"):
        if address.startswith(scheme):
            address = address[len(scheme):].rstrip("/")
            break
    if address.startswith("unix:"):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in address:
        raise ValidationError("address", f"{address!r} is not host:port")
    return address


def coalesce(chunks: Iterable[bytes | memoryview]) -> list[bytes]:
    """`chunks` as messages of about `MESSAGE_BYTES`: small chunks are joined (one
    memcpy costs far less than a gRPC message each), large ones pass as they are."""
    out: list[bytes] = []
    group: list[bytes | memoryview] = []
    size = 0
    for chunk in chunks:
        if size and size + len(chunk) > MESSAGE_BYTES:
            out.append(group[0] if len(group) == 1 and isinstance(group[0], bytes)
                       else b"".join(group))
            group, size = [], 0
        group.append(chunk)
        size += len(chunk)
    if group:
        out.append(group[0] if len(group) == 1 and isinstance(group[0], bytes)
                   else b"".join(group))
    return [part for part in out if part]


def _selector(selector: Selector | str) -> Selector:
    return selector if isinstance(selector, Selector) else Selector.parse(selector or "")


class JournalClient:
    """A connection to a broker. ``async with JournalClient("localhost:8080") as c``."""

    def __init__(self, address: str, *, retry: RetryPolicy | None = None,
                 channel_options: Sequence[tuple[str, Any]] = ()) -> None:
        self.address = parse_address(address)
        self.retry = retry or RetryPolicy()
        self._channel = grpc.aio.insecure_channel(
            self.address, options=[*CHANNEL_OPTIONS, *channel_options])
        self._stub = broker_pb2_grpc.JournalStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> JournalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _backoff(self, op: str, delays: Iterator[float], err: grpc.aio.AioRpcError
                       ) -> None:
        delay = next(delays, None)
        if delay is None or err.code() not in RETRYABLE:
            raise Unavailable(f"{op} via {self.address}: {err.code().name}: "
                              f"{err.details()}") from err
        RETRIES.labels(op).inc()
        log.debug("%s failed (%s); retrying in %.2fs", op, err.code().name, delay)
        await asyncio.sleep(delay)

    # -- appends --

    async def append(self, journal: str, content: Content, *, offset: int | None = None,
                     check_registers: Selector | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None) -> AppendResult:
        """Append `content` to `journal` atomically. Raises `BrokerError` when refused
        (nothing was written). A streamed (async) `content` is not retried: it cannot
        be replayed."""
        names.validate_journal_name(journal, "journal")
        first = pb.AppendRequest(journal=journal, offset=offset or 0)
        if check_registers is not None:
            first.check_registers.CopyFrom(selector_to_pb(check_registers))
        if union_registers:
            first.union_registers.CopyFrom(labels_to_pb(union_registers))
        if subtract_registers:
            first.subtract_registers.CopyFrom(labels_to_pb(subtract_registers))
        replayable = not isinstance(content, AsyncIterable)
        parts: list[bytes] = []
        if isinstance(content, bytes) and len(content) <= MESSAGE_BYTES:
            parts = [content]
        elif isinstance(content, bytes | memoryview):
            view = memoryview(content)
            parts = [bytes(view[i:i + MESSAGE_BYTES])
                     for i in range(0, len(view), MESSAGE_BYTES)]
        elif replayable:
            parts = coalesce(content)  # type: ignore[arg-type]
        delays = iter(self.retry.delays())
        uncertain = False
        while True:
            sent_commit = False

            async def requests() -> AsyncIterator[pb.AppendRequest]:
                nonlocal sent_commit
                yield first
                if replayable:
                    for part in parts:
                        yield pb.AppendRequest(content=part)
                else:
                    async for chunk in content:  # type: ignore[union-attr]
                        yield pb.AppendRequest(content=chunk)
                sent_commit = True
                yield pb.AppendRequest()

            try:
                resp = await self._stub.Append(requests())
            except grpc.aio.AioRpcError as err:
                if not replayable:
                    raise Unavailable(f"append to {journal}: {err.code().name}: "
                                      f"{err.details()}") from err
                if sent_commit:
                    if offset is None:
                        raise AppendUncertain(
                            f"append to {journal}: the answer to its commit was lost "
                            f"({err.code().name}); it may or may not have committed") from err
                    uncertain = True
                await self._backoff("append", delays, err)
                continue
            if resp.status == pb.WRONG_APPEND_OFFSET and uncertain and offset is not None:
                return await self._resolve(journal, offset, parts)
            if resp.status != pb.OK:
                raise BrokerError(pb.Status.Name(resp.status), journal)
            commit = fragment_from_pb(resp.commit, "commit")
            APPENDS.inc()
            APPEND_BYTES.inc(commit.size)
            return AppendResult(commit, labels_from_pb(resp.registers, "registers"))

    async def _resolve(self, journal: str, offset: int, parts: list[bytes]
                       ) -> AppendResult:
        """An uncertain append at `offset`: did our bytes land there?"""
        sha1 = hashlib.sha1()
        size = 0
        for part in parts:
            sha1.update(part)
            size += len(part)
        written = hashlib.sha1()
        frag: Fragment | None = None
        async for chunk in self.read(journal, offset, end_offset=offset + size):
            written.update(chunk.content)
            frag = chunk.fragment
        if frag is None or written.digest() != sha1.digest():
            raise BrokerError("WRONG_APPEND_OFFSET", journal,
                              f"another write landed at offset {offset}")
        commit = Fragment(journal, offset, offset + size, sha1.digest())
        return AppendResult(commit, LabelSet())

    # -- reads --

    async def read(self, journal: str, offset: int = 0, *, block: bool = False,
                   end_offset: int = 0, direct: bool = False) -> AsyncIterator[ReadChunk]:
        """Content of `journal` from `offset` (-1: the write head) to its write head (or
        for ever with `block`, or to `end_offset`). With `direct`, persisted fragments
        are read from their stores by URL rather than through the broker."""
        names.validate_journal_name(journal, "journal")
        delays = iter(self.retry.delays())
        while not end_offset or offset < end_offset:
            try:
                if direct:
                    moved = False
                    async for chunk in self._read_direct(journal, offset, block, end_offset):
                        offset = chunk.offset + len(chunk.content)
                        moved = True
                        yield chunk
                    if moved:
                        continue  # past a persisted fragment: look again
                async for chunk in self._read_stream(journal, offset, block, end_offset):
                    offset = chunk.offset + len(chunk.content)
                    delays = iter(self.retry.delays())  # progress: a fresh retry budget
                    yield chunk
                return
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.DATA_LOSS:
                    raise BrokerError("DATA_LOSS", journal, err.details() or "") from err
                await self._backoff("read", delays, err)

    async def _read_stream(self, journal: str, offset: int, block: bool, end_offset: int
                           ) -> AsyncIterator[ReadChunk]:
        call = self._stub.Read(pb.ReadRequest(journal=journal, offset=offset, block=block,
                                              end_offset=end_offset))
        try:
            async for resp in call:
                if resp.status == pb.OFFSET_NOT_YET_AVAILABLE and not block:
                    return  # at the write head
                if resp.status != pb.OK:
                    raise BrokerError(pb.Status.Name(resp.status), journal)
                if not resp.content:
                    continue
                READ_BYTES.inc(len(resp.content))
                yield ReadChunk(resp.offset, resp.content,
                                fragment_from_pb(resp.fragment), resp.write_head)
        finally:
            call.cancel()

    async def _read_direct(self, journal: str, offset: int, block: bool, end_offset: int
                           ) -> AsyncIterator[ReadChunk]:
        """Content of the persisted fragment at `offset`, fetched from its store; nothing
        if the broker offers no URL for it (then the caller reads through the broker)."""
        resp = await self._metadata(journal, offset, block)
        if resp is None or not resp.fragment_url:
            return
        frag = fragment_from_pb(resp.fragment)
        pos = resp.offset
        async for content in fetch_fragment(resp.fragment_url, frag, pos):
            if end_offset and pos + len(content) > end_offset:
                content = content[:end_offset - pos]
            READ_BYTES.inc(len(content))
            yield ReadChunk(pos, content, frag, resp.write_head)
            pos += len(content)
            if end_offset and pos >= end_offset:
                return

    async def _metadata(self, journal: str, offset: int, block: bool) -> Any:
        """The metadata-only read response at `offset` (None at the write head)."""
        async for resp in self._stub.Read(pb.ReadRequest(
                journal=journal, offset=offset, block=block, metadata_only=True)):
            if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                return None if not block else resp
            if resp.status != pb.OK:
                raise BrokerError(pb.Status.Name(resp.status), journal)
            return resp
        return None

    async def write_head(self, journal: str) -> int:
        """The journal's write head: the offset its next append will start at."""
        names.validate_journal_name(journal, "journal")
        delays = iter(self.retry.delays())
        while True:
            try:
                async for resp in self._stub.Read(pb.ReadRequest(
                        journal=journal, offset=-1, metadata_only=True)):
                    if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                        raise BrokerError(pb.Status.Name(resp.status), journal)
                    return int(resp.write_head)
                raise BrokerError("NO_RESPONSE", journal)
            except grpc.aio.AioRpcError as err:
                await self._backoff("write_head", delays, err)

    # -- specs --

    async def list(self, selector: Selector | str = "") -> Listing:
        """Journals whose labels match `selector` (all with an empty one)."""
        request = pb.ListRequest(selector=selector_to_pb(_selector(selector)))
        delays = iter(self.retry.delays())
        while True:
            try:
                async for resp in self._stub.List(request):
                    return self._listing(resp)
                raise BrokerError("NO_RESPONSE")
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ValidationError("selector", err.details() or "") from err
                await self._backoff("list", delays, err)

    async def watch(self, selector: Selector | str = "") -> AsyncIterator[Listing]:
        """A fresh `Listing` now and on every change, reconnecting after failures."""
        request = pb.ListRequest(selector=selector_to_pb(_selector(selector)), watch=True)
        delays = iter(self.retry.delays())
        while True:
            try:
                async for resp in self._stub.List(request):
                    delays = iter(self.retry.delays())
                    yield self._listing(resp)
                return
            except grpc.aio.AioRpcError as err:
                await self._backoff("watch", delays, err)

    @staticmethod
    def _listing(resp: Any) -> Listing:
        if resp.status != pb.OK:
            raise BrokerError(pb.Status.Name(resp.status))
        journals = [ListedJournal(journal_spec_from_pb(j.spec), j.mod_revision,
                                  j.create_revision, Route.from_pb(j.route))
                    for j in resp.journals]
        return Listing(resp.header.etcd.revision, sorted(journals, key=lambda j: j.spec.name))

    async def apply(self, changes: Sequence[SpecChange[JournalSpec]]) -> int:
        """Apply `changes` in one transaction; returns its etcd revision. Raises
        `ApplyConflict` if any expected revision is stale (then nothing changed)."""
        request = pb.ApplyRequest()
        for change in changes:
            item = request.changes.add(expect_mod_revision=change.revision)
            if change.spec is None:
                item.delete = change.name
            else:
                item.upsert.CopyFrom(journal_spec_to_pb(change.spec))
        try:
            resp = await self._stub.Apply(request)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValidationError("changes", err.details() or "") from err
            raise Unavailable(f"apply via {self.address}: {err.code().name}: "
                              f"{err.details()}") from err
        if resp.status == pb.ETCD_TRANSACTION_FAILED:
            raise ApplyConflict(resp.header.etcd.revision)
        if resp.status != pb.OK:
            raise BrokerError(pb.Status.Name(resp.status))
        return int(resp.header.etcd.revision)

    # -- fragments --

    async def fragments(self, journal: str, *, begin_mod_time: int = 0,
                        end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                        page_limit: int = 0) -> AsyncIterator[builtins.list[FragmentInfo]]:
        """The journal's fragments, a page at a time."""
        names.validate_journal_name(journal, "journal")
        token = 0
        while True:
            request = pb.FragmentsRequest(journal=journal, begin_mod_time=begin_mod_time,
                                          end_mod_time=end_mod_time, page_limit=page_limit,
                                          next_page_token=token)
            if signature_ttl:
                request.signature_ttl.CopyFrom(duration_to_pb(signature_ttl))
            delays = iter(self.retry.delays())
            while True:
                try:
                    resp = await self._stub.ListFragments(request)
                    break
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        raise ValidationError("fragments", err.details() or "") from err
                    await self._backoff("fragments", delays, err)
            if resp.status != pb.OK:
                raise BrokerError(pb.Status.Name(resp.status), journal)
            yield [FragmentInfo(fragment_from_pb(i.spec), i.signed_url)
                   for i in resp.fragments]
            token = resp.next_page_token
            if not token:
                return

    async def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                             end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                             page_limit: int = 0) -> builtins.list[FragmentInfo]:
        """Every fragment of the journal (all pages)."""
        out: builtins.list[FragmentInfo] = []
        async for page in self.fragments(journal, begin_mod_time=begin_mod_time,
                                         end_mod_time=end_mod_time,
                                         signature_ttl=signature_ttl, page_limit=page_limit):
            out.extend(page)
        return out
