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
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, NoReturn, TextIO

from gazette.gazctl.config import (
    MAX_TXN_SIZE,
    Address,
    UsageError,
    broker_address,
    consumer_address,
    duration_arg,
    journal_arg,
    offset_arg,
    selector_arg,
    size_arg,
    time_arg,
    txn_size_arg,
)
from gazette.gazctl.framing import MAX_RECORD
from gazette.gazctl.output import LOG_LEVELS, JsonFormatter, TextFormatter
from gazette.labels import Selector

if TYPE_CHECKING:
    from gazette.gazctl.context import Command

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: The distribution gazctl comes in (pyproject.toml's ``name``): where its version is.
DISTRIBUTION = "gazette-py"


def version() -> str:
    """The installed distribution's version; a placeholder when run from a source tree
    that was never installed (there is no other place to read it from)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


def _global_flags() -> Parser:
    """Flags every (sub)command takes; SUPPRESS so a later level does not reset them."""
    common = Parser(add_help=False)
    group = common.add_argument_group("global flags")
    group.add_argument("--broker", "--broker.address", dest="broker",
                       default=argparse.SUPPRESS, metavar="ADDRESS",
                       help="broker address, host:port, http://host:port or "
                            "https://host:port (TLS) [$BROKER_ADDRESS, gazctl.ini] "
                            "(default: localhost:8080)")
    group.add_argument("--auth.token", dest="auth_token", default=argparse.SUPPRESS,
                       metavar="TOKEN", help="bearer token of every request [$AUTH_TOKEN]")
    group.add_argument("--tls.ca-file", dest="tls_ca_file", default=argparse.SUPPRESS,
                       metavar="FILE", help="talk TLS, verifying servers with this PEM CA "
                                            "bundle [$TLS_CA_FILE]")
    group.add_argument("--tls.cert-file", dest="tls_cert_file", default=argparse.SUPPRESS,
                       metavar="FILE", help="client certificate, for servers that require "
                                            "one (mTLS) [$TLS_CERT_FILE]")
    group.add_argument("--tls.key-file", dest="tls_key_file", default=argparse.SUPPRESS,
                       metavar="FILE", help="key of --tls.cert-file [$TLS_KEY_FILE]")
    group.add_argument("--log.level", dest="log_level", choices=LOG_LEVELS,
                       default=argparse.SUPPRESS, help="log level [$LOG_LEVEL] (default: info)")
    group.add_argument("--log.format", dest="log_format", choices=("text", "json"),
                       default=argparse.SUPPRESS,
                       help="log format [$LOG_FORMAT] (default: text)")
    return common


def build_parser() -> Parser:
    """The whole command line."""
    from gazette.gazctl import apply as apply_cmd
    from gazette.gazctl import auth_cmd, events_cmd
    from gazette.gazctl import fragments as fragments_cmd
    from gazette.gazctl import journals as cmd
    from gazette.gazctl import shards as shards_cmd

    common = _global_flags()
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog="gazctl", parents=[common], formatter_class=raw,
                    description="gazctl talks to Gazette brokers and consumers.",
                    epilog="Run 'gazctl journals --help' or 'gazctl shards --help' for "
                           "their commands.")
    parser.add_argument("--version", action="version", version=f"gazctl {version()}",
                        help="print gazctl's version and exit")
    parser.set_defaults(help_parser=parser, verb=None)
    nouns = parser.add_subparsers(dest="noun", metavar="COMMAND")
    journals = nouns.add_parser("journals", parents=[common], help="work with journals",
                                description="List, apply, edit, append to, read, and "
                                            "inspect the fragments of journals.")
    journals.set_defaults(help_parser=journals)
    verbs = journals.add_subparsers(dest="verb", metavar="VERB")

    def txn_size(p: Parser) -> None:
        p.add_argument("--max-txn-size", type=txn_size_arg, default=MAX_TXN_SIZE,
                       metavar="N",
                       help="apply at most N changes in one transaction: more go in "
                            "batches, each atomic, the whole not "
                            f"(1-{MAX_TXN_SIZE}, default: {MAX_TXN_SIZE})")

    def verb(name: str, run: Command, help_: str, description: str) -> Parser:
        p: Parser = verbs.add_parser(name, parents=[common], help=help_, formatter_class=raw,
                                     description=description)
        p.set_defaults(run=run)
        return p

    def selector(p: Parser, required: bool, what: str) -> None:
        p.add_argument("-l", "--selector", type=selector_arg, required=required,
                       default=None if required else Selector(), metavar="SELECTOR",
                       help=f"label selector of the journals {what}, e.g. "
                            "'prefix=foobar/, name not in (foobar/part-001)'")

    p = verb("list", cmd.cmd_list, "list journals",
             "List journals matching a selector: a table (with --primary, --replicas, "
             "...\ncolumns), the YAML spec tree with each journal's revision (for apply),"
             "\nor one JSON object a journal.")
    selector(p, False, "to list (default: all)")
    p.add_argument("-o", "--format", choices=("table", "yaml", "json"), default="table",
                   help="output format (default: table)")
    p.add_argument("-p", "--primary", action="store_true", help="show the primary column")
    p.add_argument("-r", "--replicas", action="store_true", help="show the replicas column")
    p.add_argument("--rf", action="store_true", help="show the replication factor column")
    p.add_argument("--stores", action="store_true", help="show the fragment stores column")
    p.add_argument("-L", "--label-columns", action="append", default=[], metavar="LABEL",
                   help="show a label's values as a column (repeatable)")

    p = verb("apply", apply_cmd.cmd_apply, "apply journal specs from YAML",
             "Apply a YAML tree of journal specs (as 'list --format yaml' prints it) in\n"
             "one transaction (more than --max-txn-size changes: in batches, each one\n"
             "transaction). A spec with 'revision: N' is applied only if the journal\n"
             "is still at revision N; without one, only if it does not exist yet.\n"
             "'delete: true' deletes a journal. With etcd's address (--etcd.address),\n"
             "a journal whose stores no registered broker serves is refused, unless\n"
             "--allow-unserved-stores.")
    p.add_argument("-f", "--specs", dest="file", default="-", metavar="FILE",
                   help="YAML file to apply, '-' for stdin (default: -)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and show the changes, apply nothing")
    p.add_argument("--etcd.address", dest="etcd_address", default="", metavar="URL",
                   help="etcd of the broker cluster, to check that a registered broker "
                        "serves each journal's stores [$ETCD_ADDRESS] (default: none, "
                        "no check)")
    p.add_argument("--etcd.prefix", dest="etcd_prefix", default="", metavar="PREFIX",
                   help="etcd prefix of the broker cluster [$ETCD_PREFIX] "
                        "(default: /gazette/cluster)")
    p.add_argument("--allow-unserved-stores", action="store_true",
                   help="apply journals whose stores no registered broker serves (they "
                        "are not assigned until one does)")
    txn_size(p)

    p = verb("edit", apply_cmd.cmd_edit, "edit journal specs in $EDITOR",
             "List the selected journals' specs into a temporary YAML file, open it in\n"
             "$EDITOR (default: vi), and apply what you saved, with revision checks.")
    selector(p, True, "to edit")
    txn_size(p)

    p = verb("append", cmd.cmd_append, "append stdin to a journal",
             "Append the input to one journal, streaming it as it arrives. With lines\n"
             "(the default) or fixed framing, whole records are batched into appends\n"
             "(up to 1 MiB, or what came within 100 ms) and never split between them;\n"
             "with none, all of the input is one atomic append.")
    p.add_argument("journal", nargs="?", type=journal_arg, help="the journal to append to")
    p.add_argument("-l", "--selector", type=selector_arg, default=None, metavar="SELECTOR",
                   help="label selector matching exactly one journal (instead of JOURNAL)")
    p.add_argument("--framing", choices=("lines", "none", "fixed"), default="lines",
                   help="records of the input (default: lines)")
    p.add_argument("-i", "--input", default="-", metavar="FILE",
                   help="input file, '-' for stdin (default: -)")
    p.add_argument("--max-record-size", type=size_arg, default=MAX_RECORD, metavar="BYTES",
                   help="longest line or frame (and append) of lines or fixed framing: "
                        "a longer one is an error (default: 268435456, 256 MiB, the "
                        "broker's default --broker.max-append-size)")

    p = verb("read", cmd.cmd_read, "read journals to stdout",
             "Write the content of the selected journals to stdout, from offset 0 (or\n"
             "--offset, or the write head with --tail) up to their write heads, or for\n"
             "ever with --block. Journals are read concurrently; their content is\n"
             "written in whole chunks, never interleaved within one.")
    selector(p, True, "to read")
    p.add_argument("-b", "--block", action="store_true",
                   help="do not stop at the write head: wait for and stream new content")
    p.add_argument("--tail", action="store_true", help="start at the write head")
    p.add_argument("--offset", type=offset_arg, default=0, metavar="N",
                   help="start at byte offset N (default: 0)")
    p.add_argument("--direct", action="store_true",
                   help="read persisted fragments straight from their stores")

    p = verb("fragments", fragments_cmd.cmd_fragments, "list fragments of journals",
             "List the fragments of the selected journals as a table or JSON lines.\n"
             "TIME is Unix seconds, an ISO 8601 time (2026-01-02T15:04:05Z) or a\n"
             "duration ago (1h).")
    selector(p, False, "(default: all)")
    p.add_argument("--from", dest="from_", type=time_arg, default=0, metavar="TIME",
                   help="only fragments persisted at or after TIME")
    p.add_argument("--to", type=time_arg, default=0, metavar="TIME",
                   help="only fragments persisted before TIME")
    p.add_argument("--url", action="store_true", help="add signed GET URLs (URL column)")
    p.add_argument("--signature-ttl", type=duration_arg, default=timedelta(hours=24),
                   metavar="DURATION", help="how long --url URLs are valid (default: 24h)")
    p.add_argument("--url-ttl", type=duration_arg, default=None, metavar="DURATION",
                   help="like --url --signature-ttl DURATION")
    p.add_argument("-o", "--format", choices=("table", "json"), default="table",
                   help="output format (default: table)")

    p = verb("prune", fragments_cmd.cmd_prune, "remove fragments older than their retention",
             "Remove the persisted fragments of the selected journals that are older\n"
             "than their spec's fragment.retention (journals without one are skipped)\n"
             "from their stores, and print what went. file:// stores need --file-root.")
    selector(p, True, "to prune")
    p.add_argument("--dry-run", action="store_true", help="show what would be removed")
    p.add_argument("--file-root", metavar="DIR", default=None,
                   help="folder of file:// stores: the broker's --broker.file-root "
                        "[$BROKER_FILE_ROOT]")

    shards_cmd.add_parser(nouns, common, txn_size)
    events_cmd.add_parser(nouns, common)
    auth_cmd.add_parser(nouns, common)
    return parser


def _check_args(args: argparse.Namespace) -> None:
    """Flag combinations argparse cannot express; UsageError."""
    if args.verb == "append":
        if args.journal and args.selector is not None:
            raise UsageError("append: give a JOURNAL or -l SELECTOR, not both")
        if not args.journal and args.selector is None:
            raise UsageError("append: give the JOURNAL to append to, or -l SELECTOR")
    if args.verb == "read" and args.tail and args.offset:
        raise UsageError("read: --tail and --offset exclude each other")


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
        _check_args(args)
        address = broker_address(getattr(args, "broker", None), env)
        auth = _client_auth(args, env)
        effective = _scheme_checked(auth, address, "broker")
        if args.noun == "shards":
            args.consumer_address = consumer_address(getattr(args, "consumer", None), env)
            _scheme_checked(effective, args.consumer_address, "consumer")
    except UsageError as err:
        _error(err_stream, err)
        return EXIT_USAGE
    return _Invocation(args, address, level, fmt, stdin if stdin is not None else sys.stdin,
                       stdout if stdout is not None else sys.stdout.buffer, err_stream, env,
                       stdout is None, auth)


def _scheme_checked(auth: Any, address: Any, what: str) -> Any:
    """`auth` as `address`'s scheme asks (https:// is TLS); UsageError when the two
    disagree (http:// with TLS files), naming where the address came from."""
    from gazette.auth import auth_for
    from gazette.errors import ValidationError

    try:
        return auth_for(address.address, auth)
    except ValidationError as err:
        raise UsageError(f"{what} address from {address.source}: {err.reason}") from None


def _client_auth(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """The `ClientAuth` of the flags, else the environment (UsageError naming what is
    wrong: a missing file, a malformed token)."""
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
