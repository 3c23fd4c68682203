"""The shell of a serving process (a broker, a consumer member): flags with environment
fallbacks, logging, garbage-collector tuning, and serving until signalled.

`add_flags` declares a config dataclass's flags (`Flag`: flag, environment variable,
field, type, help), each defaulting to its environment variable, else the field's
default; `config_values` reads them back. `serve_until_signalled` starts a server, runs
it until SIGTERM/SIGINT (exit 0) or until it can no longer serve (lease lost, a task
failed for good: exit 1, so its supervisor restarts it), then stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, Protocol

import grpc

from gazette.errors import GazetteError
from gazette.keyspace import LeaseLost
from gazette.supervise import TaskFailed, await_chain

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


def default_member_suffix(fallback: str) -> str:
    """A unique-enough member name: the host name and a random tag."""
    host = "".join(ch if ch.isalnum() or ch in "-_." else "-"
                   for ch in socket.gethostname())[:100] or fallback
    return f"{host}-{secrets.token_hex(3)}"


#: (flag, environment variable, config field, type, help)
Flag = tuple[str, str, str, Callable[[str], Any], str]


def flag_bool(text: str) -> bool:
    """A boolean flag's value: true/false, yes/no, on/off, 1/0."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0", ""):
        return False
    raise ValueError(f"{text!r} is not true or false")


flag_bool.__name__ = "boolean (true/false)"

#: The security flags of a serving member (fields of `gazette.auth.SecurityConfig`).
SECURITY_FLAGS: list[Flag] = [
    ("--tls.cert-file", "TLS_CERT_FILE", "tls_cert_file", str,
     "PEM certificate chain of the gRPC and HTTP listeners (TLS on when set), also the "
     "client certificate toward other members; re-read when it changes"),
    ("--tls.key-file", "TLS_KEY_FILE", "tls_key_file", str,
     "PEM private key of --tls.cert-file"),
    ("--tls.ca-file", "TLS_CA_FILE", "tls_ca_file", str,
     "PEM CA bundle verifying the members this one calls (and clients, with mTLS)"),
    ("--tls.client-auth", "TLS_CLIENT_AUTH", "tls_client_auth", flag_bool,
     "require client certificates signed by --tls.ca-file (mutual TLS)"),
    ("--auth.keys-file", "AUTH_KEYS_FILE", "auth_keys_file", str,
     "file of the cluster's token signing keys (base64, separated by whitespace or "
     "commas; the first signs, all verify): every request then needs a bearer token"),
    ("--auth.token", "AUTH_TOKEN", "auth_token", str,
     "bearer token of this member's own calls, when it has no keys"),
    ("--etcd.cert-file", "ETCD_CERT_FILE", "etcd_cert_file", str,
     "PEM client certificate toward etcd (with an https:// --etcd.address)"),
    ("--etcd.key-file", "ETCD_KEY_FILE", "etcd_key_file", str,
     "PEM private key of --etcd.cert-file"),
    ("--etcd.ca-file", "ETCD_CA_FILE", "etcd_ca_file", str,
     "PEM CA bundle verifying etcd's certificate"),
    ("--log.access", "LOG_ACCESS", "log_access", flag_bool,
     "log one line per gRPC call: method, status, seconds, peer, caller"),
]


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log.level", dest="log_level",
                        default=os.environ.get("LOG_LEVEL", "info"),
                        choices=["debug", "info", "warn", "warning", "error"],
                        help="log level [$LOG_LEVEL] (default: info)")
    parser.add_argument("--log.format", dest="log_format",
                        default=os.environ.get("LOG_FORMAT", "text"), choices=["text", "json"],
                        help="log format [$LOG_FORMAT] (default: text)")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)-5s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if level.startswith("warn") else level.upper())


def env_default(prog: str, env: str, convert: Callable[[str], Any], fallback: Any) -> Any:
    """The value of environment variable `env` (converted), else `fallback`; a value
    that does not convert exits with a message naming it."""
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return fallback
    try:
        return convert(raw)
    except ValueError:
        raise SystemExit(f"{prog}: ${env}={raw!r} is not a valid "
                         f"{getattr(convert, '__name__', 'value')}") from None


def field_defaults(config_class: type) -> SimpleNamespace:
    """The defaults of a config dataclass's fields, without making one (it may refuse
    missing values); fields without a plain default default to ""."""
    return SimpleNamespace(**{f.name: "" if f.default is dataclasses.MISSING else f.default
                              for f in dataclasses.fields(config_class)})


def add_flags(parser: argparse.ArgumentParser, prog: str, flags: Sequence[Flag],
              config_class: type) -> None:
    """Declare `flags` on `parser`, each defaulting to its environment variable, else to
    the default of the same field of `config_class` (a dataclass)."""
    defaults = field_defaults(config_class)
    for flag, env, name, convert, text in flags:
        default = getattr(defaults, name)
        parser.add_argument(flag, dest=name, type=convert,
                            default=env_default(prog, env, convert, default),
                            help=f"{text} [${env}]" + (f" (default: {default})"
                                                        if default not in (None, "") else ""))
    add_log_flags(parser)


def config_values(args: argparse.Namespace, flags: Sequence[Flag]) -> dict[str, Any]:
    """The config fields `flags` set in `args`; an empty value is left out (the
    config's own default then applies, e.g. a generated member name)."""
    values = {name: getattr(args, name) for _, _, name, _, _ in flags}
    return {k: v for k, v in values.items() if v != ""}


#: Allocations between young-generation collections (CPython's default: 700): a server
#: allocates a few objects per message, and collecting every 700 of them showed up as
#: about 5 % of a broker loop's time under appends.
GC_THRESHOLD = (5_000, 20, 20)


def quiet_gc() -> None:
    """Keep the garbage collector off the hot paths: what exists after start-up (modules,
    the keyspace) is frozen out of collections, and young collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class Server(Protocol):
    async def start(self) -> None: ...

    async def wait(self) -> None: ...

    async def stop(self) -> None: ...


def log_tasks() -> None:
    """Log every asyncio task and what it awaits (on SIGUSR1): where a process that
    seems stuck waits, without stopping it (a thread dump shows only the idle loop)."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    log.warning("SIGUSR1: %d tasks\n%s", len(tasks), "\n".join(
        f"{task.get_name()}:\n{await_chain(task)}" for task in tasks))


async def serve_until_signalled(server: Server, what: str) -> int:
    """Start `server` and serve until SIGTERM/SIGINT (0), or until it can no longer
    serve (1); it is stopped (drained) either way. A start that fails is 1, logged."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, log_tasks)
    try:
        await server.start()
    except (OSError, GazetteError) as err:
        log.error("cannot start the %s: %s", what, err)
        return 1
    quiet_gc()
    status = 0
    try:
        async with asyncio.TaskGroup() as tg:
            lost = tg.create_task(server.wait())
            signalled = tg.create_task(stop.wait())
            await asyncio.wait({lost, signalled}, return_when=asyncio.FIRST_COMPLETED)
            if signalled.done():
                log.info("signalled: draining and stopping")
            lost.cancel()
            signalled.cancel()
    except* (LeaseLost, TaskFailed) as group:
        log.error("%s: stopping", group.exceptions[0])
        status = 1
    finally:
        await server.stop()
    return status
