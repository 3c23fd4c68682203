"""A small typed etcd v3 client: the one module that talks to etcd.

It rides on `aetcd` for the generated etcd stubs, opens its own channel (plain, or TLS
for an ``https://`` endpoint: etcd's own client TLS, mutual if a client certificate is
given), and calls the raw RPCs itself, because the keyspace needs what aetcd's wrappers
drop: the response header's revision, paged range reads pinned to one revision, and
watch progress requests.
"""

from __future__ import annotations

import asyncio
import ipaddress
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
from aetcd import rpc

from gazette.auth import ClientAuth, TLSFiles, open_channel
from gazette.errors import GazetteError, ValidationError

#: Reconnect fast after etcd restarts, and notice a dead peer within ~15 s.
CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 2000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.max_receive_message_length": 64 << 20,
}
RANGE_PAGE_SIZE = 2000
#: The sentinel grpc.aio streams return at their end (missing from grpc-stubs).
_STREAM_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]
DEFAULT_TIMEOUT = 10.0


class EtcdError(GazetteError):
    """etcd could not be reached or refused a request."""

    retriable = True


class LeaseNotFound(EtcdError):
    """etcd refused a write under a lease it no longer has (expired or revoked)."""


#: What a broken etcd stream raises: an RPC error, or (writing to a call that already
#: ended) InvalidStateError. Loops that re-open streams retry on these.
STREAM_ERRORS = (grpc.aio.AioRpcError, asyncio.InvalidStateError, EtcdError)


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One etcd key as stored: its value and revisions."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_pb(cls, kv: Any) -> KeyValue:
        return cls(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision,
                   kv.version, kv.lease)


@dataclass(frozen=True, slots=True)
class Event:
    """A change to a key: `kv` is the new state (value empty for a delete)."""

    deleted: bool
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class RangeResult:
    revision: int
    kvs: list[KeyValue]


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def etcd_target(endpoints: str) -> tuple[str, bool]:
    """The gRPC target of etcd's client URLs (comma-separated for the members of a
    cluster, which must then be IP addresses, or one DNS name that resolves to them
    all), and whether they are TLS (``https://``)."""
    urls = [u.strip() for u in endpoints.split(",") if u.strip()]
    if not urls:
        raise ValidationError("etcd.address", "names no endpoint")
    https = {u.startswith("https://") for u in urls}
    if len(https) > 1:
        raise ValidationError("etcd.address", f"{endpoints!r} mixes https:// and http://")
    hosts = [parse_endpoint(u) for u in urls]
    if len(hosts) == 1:
        return f"{hosts[0][0]}:{hosts[0][1]}", https.pop()
    try:
        ips = [ipaddress.ip_address(host) for host, _ in hosts]
    except ValueError:
        raise ValidationError("etcd.address", f"{endpoints!r}: several endpoints must be "
                              "IP addresses (or give one DNS name that resolves to every "
                              "member)") from None
    if {ip.version for ip in ips} != {4}:
        raise ValidationError("etcd.address", f"{endpoints!r}: several endpoints must be "
                              "IPv4 addresses")
    return "ipv4:" + ",".join(f"{host}:{port}" for host, port in hosts), https.pop()


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``http://host:port``, ``https://host:port`` (or ``host:port``) of an etcd client
    endpoint."""
    text = endpoint if "://" in endpoint else f"http://{endpoint}"
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port or 2379
    except ValueError as exc:
        raise ValidationError("etcd.address", f"{endpoint!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https", "unix") or not parts.hostname:
        raise ValidationError("etcd.address", f"{endpoint!r} must look like http://host:port "
                              "(https:// for TLS)")
    return parts.hostname, port


class Etcd:
    """A connection to etcd. Use ``async with Etcd(endpoint) as etcd``; an ``https://``
    endpoint is reached over TLS with `tls` (its CA, and a client certificate if etcd
    requires one; without `tls`, the system's CAs). The endpoints of a cluster's members
    may be given comma-separated (`etcd_target`): calls go to one that answers."""

    def __init__(self, endpoint: str = "http://127.0.0.1:2379",
                 timeout: float = DEFAULT_TIMEOUT, tls: TLSFiles | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._target, https = etcd_target(endpoint)
        if tls is not None and tls.ca_file and not https:
            raise ValidationError("etcd.address", f"{endpoint!r}: etcd TLS files are set, "
                                  "so the address must be https://")
        self._tls = (tls or TLSFiles.system()) if https else None
        self._channel: grpc.aio.Channel | None = None
        self._kv: Any = None
        self._watch: Any = None
        self._lease: Any = None

    async def connect(self) -> None:
        channel = self._channel = open_channel(self._target, list(CHANNEL_OPTIONS.items()),
                                               ClientAuth(self._tls))
        self._kv = rpc.KVStub(channel)
        self._watch = rpc.WatchStub(channel)
        self._lease = rpc.LeaseStub(channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)

    async def __aenter__(self) -> Etcd:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            error = LeaseNotFound if exc.code() == grpc.StatusCode.NOT_FOUND and \
                "lease not found" in (exc.details() or "") else EtcdError
            raise error(f"etcd {self.endpoint}: {exc.code().name}: {exc.details()}") from exc

    # -- keys --

    async def get_prefix(self, prefix: str, revision: int = 0) -> RangeResult:
        """Every key under `prefix`, read in pages that are all pinned to one revision."""
        key = prefix.encode()
        end = prefix_end(key)
        kvs: list[KeyValue] = []
        while True:
            resp = await self._call(self._kv.Range, rpc.RangeRequest(
                key=key, range_end=end, revision=revision, limit=RANGE_PAGE_SIZE,
                sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY,
            ))
            revision = revision or resp.header.revision
            kvs.extend(KeyValue.from_pb(kv) for kv in resp.kvs)
            if not resp.more or not resp.kvs:
                return RangeResult(revision, kvs)
            key = resp.kvs[-1].key + b"\0"

    async def revision(self) -> int:
        """etcd's current revision (a count-only read of one key)."""
        resp = await self._call(self._kv.Range, rpc.RangeRequest(key=b"\0", count_only=True))
        return int(resp.header.revision)

    async def get(self, key: str) -> tuple[int, KeyValue | None]:
        """The header revision and the key (None if absent)."""
        resp = await self._call(self._kv.Range, rpc.RangeRequest(key=key.encode()))
        kv = KeyValue.from_pb(resp.kvs[0]) if resp.kvs else None
        return resp.header.revision, kv

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Unconditional put; returns the new revision."""
        resp = await self._call(self._kv.Put, rpc.PutRequest(key=key.encode(), value=value,
                                                             lease=lease))
        return int(resp.header.revision)

    async def delete_prefix(self, prefix: str) -> int:
        key = prefix.encode()
        resp = await self._call(self._kv.DeleteRange,
                                rpc.DeleteRangeRequest(key=key, range_end=prefix_end(key)))
        return int(resp.header.revision)

    async def txn(self, compare: Sequence[Any], success: Sequence[Any],
                  failure: Sequence[Any] = ()) -> Any:
        """A raw transaction; see `gazette.keyspace.txn` for the friendly builder."""
        return await self._call(self._kv.Txn, rpc.TxnRequest(
            compare=list(compare), success=list(success), failure=list(failure)))

    async def count_prefix(self, prefix: str, revision: int, min_mod_revision: int
                           ) -> tuple[int, int]:
        """At `revision`, how many keys are under `prefix`, and how many of those were
        modified at or after `min_mod_revision` (one atomic read)."""
        key = prefix.encode()
        end = prefix_end(key)
        resp = await self.txn([], [
            rpc.RequestOp(request_range=rpc.RangeRequest(
                key=key, range_end=end, revision=revision, count_only=True)),
            rpc.RequestOp(request_range=rpc.RangeRequest(
                key=key, range_end=end, revision=revision, count_only=True,
                min_mod_revision=min_mod_revision)),
        ])
        total, changed = (r.response_range.count for r in resp.responses)
        return int(total), int(changed)

    async def compact(self, revision: int) -> None:
        await self._call(self._kv.Compact, rpc.CompactionRequest(revision=revision,
                                                                 physical=True))

    # -- watches --

    def open_watch(self) -> Any:
        """A raw bidirectional watch stream (grpc.aio call with write/read)."""
        return self._watch.Watch()

    @staticmethod
    def watch_create_request(prefix: str, start_revision: int) -> Any:
        key = prefix.encode()
        return rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
            key=key, range_end=prefix_end(key), start_revision=start_revision,
            progress_notify=True,
        ))

    @staticmethod
    def watch_progress_request() -> Any:
        return rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())

    @staticmethod
    def events_of(resp: Any) -> list[Event]:
        return [Event(ev.type == rpc.Event.DELETE, KeyValue.from_pb(ev.kv))
                for ev in resp.events]

    # -- leases --

    async def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (id, granted TTL in seconds)."""
        resp = await self._call(self._lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl))
        if resp.error:
            raise EtcdError(f"lease grant refused: {resp.error}")
        return int(resp.ID), int(resp.TTL)

    async def lease_revoke(self, lease_id: int) -> None:
        await self._call(self._lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id))

    def lease_keepalive_stream(self) -> Any:
        return self._lease.LeaseKeepAlive()

    @staticmethod
    def lease_keepalive_request(lease_id: int) -> Any:
        return rpc.LeaseKeepAliveRequest(ID=lease_id)

    async def lease_ttl(self, lease_id: int) -> int:
        """Seconds left on a lease; -1 if it no longer exists."""
        resp = await self._call(self._lease.LeaseTimeToLive,
                                rpc.LeaseTimeToLiveRequest(ID=lease_id))
        return int(resp.TTL)


async def iterate_stream(call: Any) -> AsyncIterator[Any]:
    """Read a grpc.aio stream until it ends."""
    while True:
        msg = await call.read()
        if msg is _STREAM_EOF:
            return
        yield msg
