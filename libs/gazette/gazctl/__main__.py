"""``gazctl``: journals and consumer shards from the command line, as in the tutorials.

    gazctl journals list [-l SELECTOR] [--primary] [--replicas] [--format table|yaml|json]
    gazctl journals apply [-f FILE|-] [--dry-run] [--max-txn-size N] [--etcd.address URL]
        [--allow-unserved-stores]
    gazctl journals edit -l SELECTOR [--max-txn-size N]
    gazctl journals append (-l SELECTOR | JOURNAL) [--framing lines|none|fixed]
                           [--max-record-size BYTES]
    gazctl journals read -l SELECTOR [--block] [--tail] [--offset N] [--direct]
    gazctl journals fragments [-l SELECTOR] [--from T] [--to T] [--url] [--format table|json]
    gazctl journals prune -l SELECTOR [--dry-run] [--file-root DIR]
    gazctl shards list [-l SELECTOR] [--primary] [--lag] [--format table|yaml|json]
    gazctl shards apply [-f FILE|-] [--dry-run] [--max-txn-size N] [--allow-missing-journals]
    gazctl shards edit -l SELECTOR [--max-txn-size N]
    gazctl shards unassign -l SELECTOR [--failed] [--dry-run]
    gazctl shards hints --shard ID [--format yaml|json]
    gazctl shards prune [-l SELECTOR] [--dry-run]
    gazctl events create-topic NAME [--partitions N] [--replication R] [--fragment-store URL]
    gazctl events dead-letters --topic T --group G [--offset N] [--format table|json]
    gazctl events replay --topic T --group G [--offset N] [--handler H] [--id ID] [--dry-run]

Global flags (anywhere on the line): ``--broker``, ``--log.level``, ``--log.format``;
``gazctl shards`` also takes ``--consumer.address`` (a member of the consumer
application); ``gazctl --version`` prints the version.
Exit status: 0 done, 1 failed, 2 bad usage. See docs/gazctl.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, TextIO

from gazette.gazctl.config import Address, UsageError, broker_address, consumer_address
from gazette.gazctl.output import LOG_LEVELS, JsonFormatter, TextFormatter
from gazette.gazctl.parser import (
    DISTRIBUTION,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    build_parser,
    check_args,
    version,
)

__all__ = ["DISTRIBUTION", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "Parser", "build_parser",
           "main", "run", "run_async", "version"]


@contextlib.contextmanager
def _logging(stream: TextIO, level: str, fmt: str) -> Iterator[None]:
    """gazctl's log lines (and the library's, at warn or above unless debugging) on
    `stream`; undone after (main may run in-process, e.g. in tests)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    numeric = logging.WARNING if level.startswith("warn") else getattr(logging, level.upper())
    library = numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
    loggers = {"gazette": library, "gazette.gazctl": numeric}
    saved = {name: (logging.getLogger(name).level, logging.getLogger(name).propagate)
             for name in loggers}
    top = logging.getLogger("gazette")
    top.addHandler(handler)
    for name, value in loggers.items():
        logging.getLogger(name).setLevel(value)
    top.propagate = False
    try:
        yield
    finally:
        top.removeHandler(handler)
        for name, (value, propagate) in saved.items():
            logging.getLogger(name).setLevel(value)
            logging.getLogger(name).propagate = propagate


def _error(stderr: TextIO, message: object) -> None:
    text = " ".join(str(message).split())
    stderr.write(f"gazctl: {text}\n")
    stderr.flush()


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the exit's flush raises nothing."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


@dataclass
class _Invocation:
    """A parsed command line, ready to run."""

    args: argparse.Namespace
    address: Address
    level: str
    fmt: str
    stdin: IO[Any]
    stdout: IO[bytes]
    stderr: TextIO
    env: Mapping[str, str]
    own_stdout: bool  # the process's stdout (quieted after EPIPE)
    auth: Any = None  # a gazette.auth.ClientAuth: TLS and the token of every request


def _prepare(argv: list[str] | None, stdin: IO[Any] | None, stdout: IO[bytes] | None,
             stderr: TextIO | None, env: Mapping[str, str] | None) -> _Invocation | int:
    """Parse and check the command line: what to run, or the exit status of a usage
    error (reported) or of --help."""
    env = os.environ if env is None else env
    err_stream = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    if getattr(args, "verb", None) is None:  # `gazctl`, `gazctl journals`: show the verbs
        args.help_parser.print_help(err_stream)
        return EXIT_USAGE
    level = getattr(args, "log_level", None) or env.get("LOG_LEVEL") or "info"
    fmt = getattr(args, "log_format", None) or env.get("LOG_FORMAT") or "text"
    if level not in LOG_LEVELS or fmt not in ("text", "json"):
        _error(err_stream, f"$LOG_LEVEL={level!r} or $LOG_FORMAT={fmt!r} is not valid "
                           f"(levels: {', '.join(LOG_LEVELS)}; formats: text, json)")
        return EXIT_USAGE
    try:
        check_args(args)
        address = broker_address(getattr(args, "broker", None), env)
        auth = client_auth(args, env)
        effective = scheme_checked(auth, address, "broker")
        if args.noun == "shards":
            args.consumer_address = consumer_address(getattr(args, "consumer", None), env)
            scheme_checked(effective, args.consumer_address, "consumer")
    except UsageError as err:
        _error(err_stream, err)
        return EXIT_USAGE
    return _Invocation(args, address, level, fmt, stdin if stdin is not None else sys.stdin,
                       stdout if stdout is not None else sys.stdout.buffer, err_stream, env,
                       stdout is None, auth)


def scheme_checked(auth: Any, address: Any, what: str) -> Any:
    """`auth` as `address`'s scheme asks (https:// is TLS); UsageError when the two
    disagree (http:// with TLS files), naming where the address came from."""
    from gazette.auth import auth_for
    from gazette.errors import ValidationError

    try:
        return auth_for(address.address, auth)
    except ValidationError as err:
        raise UsageError(f"{what} address from {address.source}: {err.reason}") from None


def client_auth(args: object, env: Mapping[str, str]) -> Any:
    """The `ClientAuth` of the flags (`args`' attributes), else the environment
    (UsageError naming what is wrong: a missing file, a malformed token)."""
    from gazette.auth import ClientAuth, TLSFiles
    from gazette.errors import ValidationError

    def value(name: str, var: str) -> str:
        return str(getattr(args, name, None) or env.get(var, "") or "")

    ca, cert, key = (value("tls_ca_file", "TLS_CA_FILE"),
                     value("tls_cert_file", "TLS_CERT_FILE"), value("tls_key_file", "TLS_KEY_FILE"))
    try:
        tls = TLSFiles(cert, key, ca) if ca or cert else None
        return ClientAuth(tls, value("auth_token", "AUTH_TOKEN").strip())
    except ValidationError as err:
        raise UsageError(str(err)) from None


async def _execute(inv: _Invocation) -> int:
    from gazette.client import JournalClient, RetryPolicy
    from gazette.gazctl.context import Context

    quick = RetryPolicy(attempts=3, initial_delay=0.1, max_delay=0.5)
    async with JournalClient(inv.address.address, retry=quick, auth=inv.auth) as client, \
            JournalClient(inv.address.address, auth=inv.auth) as patient:
        ctx = Context(client, patient, inv.stdin, inv.stdout, inv.stderr, dict(inv.env))
        status: int = await inv.args.run(ctx, inv.args)
        return status


def _failure(inv: _Invocation, err: BaseException) -> int | None:
    """The exit status of a command that raised `err` (reported on stderr), or None if
    it is not one of ours to report (a bug: let it raise)."""
    import grpc

    from gazette.client import ShardUnavailable, Unavailable
    from gazette.errors import GazetteError

    if isinstance(err, KeyboardInterrupt | asyncio.CancelledError):
        return EXIT_OK if inv.args.verb == "read" else 130
    if isinstance(err, BrokenPipeError):
        if inv.own_stdout:
            _quiet_stdout()
        return EXIT_OK
    if isinstance(err, UsageError):
        _error(inv.stderr, err)
        return EXIT_USAGE
    if isinstance(err, ShardUnavailable):
        hint = ""
        if err.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            where = inv.args.consumer_address
            hint = (f" (is a consumer member listening at {where.address}? the address "
                    f"came from {where.source})")
        _error(inv.stderr, f"{err}{hint}")
    elif isinstance(err, Unavailable):
        hint = ""
        if err.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            hint = (f" (is a broker listening at {inv.address.address}? the address came "
                    f"from {inv.address.source})")
        _error(inv.stderr, f"{err}{hint}")
    elif isinstance(err, GazetteError | OSError):
        _error(inv.stderr, err)
    elif isinstance(err, grpc.aio.AioRpcError):
        _error(inv.stderr, f"broker {inv.address.address}: {err.code().name}: "
                           f"{err.details()}")
    else:
        return None
    return EXIT_FAILED


async def run_async(argv: list[str] | None = None, *, stdin: IO[Any] | None = None,
                    stdout: IO[bytes] | None = None, stderr: TextIO | None = None,
                    env: Mapping[str, str] | None = None) -> int:
    """`run` on the running event loop (for embedding and tests: gRPC's asyncio support
    wants one event loop per process)."""
    inv = _prepare(argv, stdin, stdout, stderr, env)
    if isinstance(inv, int):
        return inv
    with _logging(inv.stderr, inv.level, inv.fmt):
        try:
            return await _execute(inv)
        except Exception as err:
            status = _failure(inv, err)
            if status is None:
                raise
            return status


async def _with_sigterm(inv: _Invocation) -> int:
    """`_execute`, cancelled by SIGTERM as Ctrl-C would (in the main thread)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    return await _execute(inv)


def run(argv: list[str] | None = None, *, stdin: IO[Any] | None = None,
        stdout: IO[bytes] | None = None, stderr: TextIO | None = None,
        env: Mapping[str, str] | None = None) -> int:
    """gazctl with these arguments, streams and environment (default: the process's),
    on an event loop of its own; the exit status."""
    import uvloop

    inv = _prepare(argv, stdin, stdout, stderr, env)
    if isinstance(inv, int):
        return inv
    with _logging(inv.stderr, inv.level, inv.fmt):
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(_with_sigterm(inv))
        except (Exception, KeyboardInterrupt, asyncio.CancelledError) as err:
            status = _failure(inv, err)
            if status is None:
                raise
            return status


def main(argv: list[str] | None = None) -> int:
    """The ``gazctl`` console script."""
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
