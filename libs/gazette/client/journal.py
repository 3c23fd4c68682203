"""`JournalClient`: appends, reads, listings, spec changes and fragment listings against
a broker, over one gRPC channel.

Retries. Transport failures (a broker restarting, a cut connection, a timeout) are
retried with jittered backoff (`RetryPolicy`), but never so that an acknowledged append
could land twice:

- an append that failed before its commit message was handed to gRPC is sent again:
  nothing of it can have committed (the broker rolls back an append whose stream ends
  without its commit);
- one whose commit was sent but whose answer was lost is *uncertain*. With an expected
  `offset`, the client resolves it: it sends it again at the same offset. The broker
  takes one append at a time and checks the offset under that lock, so at most one of
  the attempts can commit; WRONG_APPEND_OFFSET means something was written there first,
  and the client reads those bytes back and compares their SHA-1 with its own: equal
  means the first attempt committed (success), anything else means another writer won
  (`BrokerError`, nothing of ours was written). Without an offset it raises
  `AppendUncertain`.

A reader resumes after a failure at the next offset it has not yielded, so it never
yields a byte twice nor skips one.

Routing. Any broker of a cluster takes any request and forwards it to the broker that
serves the journal. With ``route_appends=True`` the client instead learns each journal's
primary from the route in response headers and sends later appends of that journal
straight to it (one hop less), falling back to its own address when the primary cannot
be reached or the route changes. Brokers' advertised endpoints must then be reachable
from the client.

The data path. A broker started with ``--broker.data-port`` advertises a data endpoint
in routes (`gazette.protocol.frames`): with ``data_path=True`` (the default) the client
then sends a journal's appends that fit a frame straight to its primary's, pipelined on
one connection, once a response named it (`gazette.client.framed`); others, and all
while that endpoint cannot be reached, go by gRPC as before. Same retries and
resolution; a commit made there carries `NO_SHA1` (the broker checked the content's
CRC-32 instead of summing it apart).

Where each part lives: `connection` (address, channel, retries, argument checks),
`reads` (`read`, `write_head`), `appends` (`append`, holding the reads to resolve lost
answers, and routing), `specs` (`list`, `watch`, `apply`, `fragments`); `JournalClient`
holds one of each, over one `Connection`, and passes its calls on to them.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from datetime import timedelta
from typing import Any, Self

from gazette.auth import ClientAuth
from gazette.client.appends import AppendContent, Appends
from gazette.client.connection import Connection
from gazette.client.framed import FramedConnection
from gazette.client.reads import Reads
from gazette.client.results import AppendResult, ReadChunk
from gazette.client.retry import RetryPolicy
from gazette.client.specs import Applied, FragmentInfo, Listing, Specs
from gazette.labels import LabelSet, Selector
from gazette.protocol import JournalSpec
from gazette.protocol.trees import SpecChange


class JournalClient:
    """A client of one broker (``async with JournalClient("localhost:8080") as c``).

    `address` is ``host:port``, ``http://host:port`` or ``grpc://host:port``, or a gRPC
    target such as ``unix:/path``. `retry` governs retries of transport failures;
    `timeout` bounds each unary request (listings, applies, metadata reads, appends that
    fit one message: one that times out is in doubt; not streamed appends and reads,
    which may take long); `channel_options` are added to (and override)
    the client's gRPC channel options; `auth` (a `gazette.auth.ClientAuth`) gives TLS
    files and the bearer token each call presents. Safe to share between tasks of one
    event loop.
    """

    def __init__(self, address: str, *, retry: RetryPolicy | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 timeout: float = 30.0, route_appends: bool = False,
                 auth: ClientAuth | None = None, data_path: bool = True) -> None:
        self._connection = Connection(address, retry=retry, channel_options=channel_options,
                                     timeout=timeout, auth=auth)
        self._reads = Reads(self._connection)
        self._appends = Appends(self._connection, self._reads, route_appends=route_appends,
                                data_path=data_path)
        self._specs = Specs(self._connection)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"

    @property
    def address(self) -> str:
        """The broker's gRPC target."""
        return self._connection.address

    @property
    def retry(self) -> RetryPolicy:
        return self._connection.retry

    @property
    def timeout(self) -> float:
        return self._connection.timeout

    @property
    def auth(self) -> ClientAuth:
        """TLS and the bearer token every call presents."""
        return self._connection.auth

    @property
    def route_appends(self) -> bool:
        return self._appends.route_appends

    async def close(self) -> None:
        """Close the channels: RPCs still running end with `Unavailable` (code CLOSED),
        and so do calls made afterwards."""
        await asyncio.gather(self._connection.close(), self._appends.close())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Each call below is its part's: see there for what it does and raises.

    async def append(self, journal: str, content: AppendContent, *,
                     offset: int | None = None, check_registers: Selector | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None) -> AppendResult:
        """Append `content` to `journal` atomically (`Appends.append`)."""
        return await self._appends.append(
            journal, content, offset=offset, check_registers=check_registers,
            union_registers=union_registers, subtract_registers=subtract_registers)

    def data_path(self, journal: str) -> FramedConnection | None:
        """The open data-path connection `journal`'s appends go on now, if any
        (`Appends.data_path`): appends sent there one after another commit in order."""
        return self._appends.data_path(journal)

    async def append_chained(self, conn: FramedConnection, journal: str,
                             content: list[bytes], *, chained: bool) -> AppendResult:
        """One attempt on a data path, for pipelining (`Appends.append_chained`)."""
        return await self._appends.append_chained(conn, journal, content, chained=chained)

    def read(self, journal: str, offset: int = 0, *, block: bool = False,
             end_offset: int = 0, direct: bool = False) -> AsyncGenerator[ReadChunk, None]:
        """The content of `journal` from `offset`, as chunks (`Reads.read`); close it
        early with `contextlib.aclosing`."""
        return self._reads.read(journal, offset, block=block, end_offset=end_offset,
                               direct=direct)

    async def write_head(self, journal: str) -> int:
        """The offset the journal's next append will start at (`Reads.write_head`)."""
        return await self._reads.write_head(journal)

    async def list(self, selector: Selector | str = "") -> Listing:
        """Journals whose labels match `selector` (`Specs.list`)."""
        return await self._specs.list(selector)

    def watch(self, selector: Selector | str = "") -> AsyncIterator[Listing]:
        """A `Listing` of the journals matching `selector` now and after every change
        (`Specs.watch`)."""
        return self._specs.watch(selector)

    async def apply(self, changes: Sequence[SpecChange[JournalSpec]]) -> Applied:
        """Apply `changes` of journal specs in one etcd transaction (`Specs.apply`)."""
        return await self._specs.apply(changes)

    def fragments(self, journal: str, *, begin_mod_time: int = 0, end_mod_time: int = 0,
                  signature_ttl: timedelta | None = None, page_limit: int = 0
                  ) -> AsyncIterator[builtins.list[FragmentInfo]]:
        """The journal's fragments, a page at a time (`Specs.fragments`)."""
        return self._specs.fragments(journal, begin_mod_time=begin_mod_time,
                                    end_mod_time=end_mod_time, signature_ttl=signature_ttl,
                                    page_limit=page_limit)

    async def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                             end_mod_time: int = 0, signature_ttl: timedelta | None = None,
                             page_limit: int = 0) -> builtins.list[FragmentInfo]:
        """Every fragment of the journal (`Specs.list_fragments`)."""
        return await self._specs.list_fragments(
            journal, begin_mod_time=begin_mod_time, end_mod_time=end_mod_time,
            signature_ttl=signature_ttl, page_limit=page_limit)
