"""A member's gRPC listener: `grpc_server_on` makes a server with the options every member
uses and binds its port, a port it cannot have being one clear `OSError` (not gRPC
core's own lines on stderr)."""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import grpc

log = logging.getLogger(__name__)

#: gRPC server options of a member: large messages (appends and reads stream ~1 MiB
#: chunks) and keepalive pings so dead clients are noticed.
GRPC_SERVER_OPTIONS = [
    # A port another process listens on is refused (gRPC's default, SO_REUSEPORT, would
    # let two members share it and split requests between them).
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def grpc_server_on(bind: str, port: int, what: str,
                   credentials: grpc.ServerCredentials | None = None,
                   interceptors: Sequence[Any] = ()) -> tuple[grpc.aio.Server, int]:
    """A gRPC server listening on `bind` ("" = all interfaces) and `port` (0 = a free
    one), over TLS with `credentials`, calls passing through `interceptors`; and its
    port. A port in use (or an address not this host's) is an `OSError` saying so, at
    once, before anything waits for etcd: that line only, not gRPC core's own."""
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS,
                             interceptors=list(interceptors) or None)
    address = f"{bind or '[::]'}:{port}"
    bound, said = _bind(server, address, credentials)
    if bound:
        if said:
            sys.stderr.write(said)  # it worked: nothing it said is hidden
        return server, bound
    others = [line for line in said.splitlines(keepends=True)
              if not _GRPC_CORE_LINE.match(line)]
    if others:  # another thread's, meanwhile
        sys.stderr.write("".join(others))
    log.debug("gRPC core, binding %s: %s", address, said.strip())
    if "in use" in said:
        why = f"the port is in use (another {what}?)"
    elif "assign requested address" in said:
        why = "the address is not this host's"
    else:
        why = f"the port is in use (another {what}?) or the address is not this host's"
    raise OSError(f"cannot listen for gRPC on {address}: {why}")


#: A line of gRPC core's log (``E1127 18:49:36.878100    7003 add_port.cc:83] ...``).
_GRPC_CORE_LINE = re.compile(r"[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")


def _bind(server: grpc.aio.Server, address: str,
          credentials: grpc.ServerCredentials | None) -> tuple[int, str]:
    """Add the listening port: its number (0: it failed) and what gRPC core wrote to
    stderr meanwhile (it writes there itself, past Python's logging: a raw line before
    our message)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)
        try:
            try:
                bound = server.add_secure_port(address, credentials) \
                    if credentials is not None else server.add_insecure_port(address)
            except RuntimeError:
                bound = 0
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        return bound, said.read().decode(errors="replace")
