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

Where each part lives: `connection` (channel, stubs, retries, argument checks),
`reads` (`read`, `write_head`), `appends` (`append`, built on reads to resolve lost
answers), `specs` (`list`, `watch`, `apply`, `fragments`); `JournalClient` is all of them.
"""

from __future__ import annotations

from gazette.client.appends import Appends
from gazette.client.specs import Specs


class JournalClient(Appends, Specs):
    """A client of one broker (``async with JournalClient("localhost:8080") as c``).

    `address` is ``host:port``, ``http://host:port`` or ``grpc://host:port``, or a gRPC
    target such as ``unix:/path``. `retry` governs retries of transport failures;
    `timeout` bounds each unary request (listings, applies, metadata reads; not appends
    and reads, which may stream for long); `channel_options` are added to (and override)
    the client's gRPC channel options; `auth` (a `gazette.auth.ClientAuth`) gives TLS
    files and the bearer token each call presents. Safe to share between tasks of one
    event loop.
    """
